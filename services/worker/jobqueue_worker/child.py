"""One worker process: an asyncio loop with a dispatcher, WORKERS job slots, a completer and
the recovery loop, and the graceful shutdown that ties them together.

The supervisor starts it (forked from a fork server, `jobqueue_worker.launch`) and stops it
with SIGTERM:
stop claiming, give running jobs SHUTDOWN_TIMEOUT to finish and record, release
the rest (attempt not consumed), flush the completer, exit 0. SIGINT is
ignored (a Ctrl-C reaches the whole process group; the supervisor decides), and
the process also shuts down if the supervisor disappears.

Its loop turns a heartbeat in the supervisor's `Beacon` (`jobqueue_worker.liveness`).
When more handlers than it has slots were abandoned and still run (threads that
cannot be stopped, tasks that ignore cancellation), the process recycles itself:
the same graceful stop, then exit status RECYCLE_EXIT, and the supervisor starts
a fresh one.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import signal
import sys
from types import FrameType

from jobcore import logs, naming, tracing
from jobcore.db import make_engine, session_name
from jobcore.maintenance import PRUNE_BATCH
from jobcore.notifications import UNHEARD, NotificationCheck
from jobcore.periodic import schedules
from jobcore.registry import load_handlers
from jobcore.rows import TypeLimits
from jobcore.settings import WorkerSettings
from jobqueue_worker import metrics
from jobqueue_worker.completer import Completer
from jobqueue_worker.database import POOL_SIZE, PgJobStore
from jobqueue_worker.dispatcher import Dispatcher
from jobqueue_worker.executor import Executor
from jobqueue_worker.floorcheck import FloorCheck
from jobqueue_worker.heartbeat import Heartbeat
from jobqueue_worker.history import History
from jobqueue_worker.launch import RECYCLE_EXIT
from jobqueue_worker.listener import Listener
from jobqueue_worker.liveness import RECYCLING, RUNNING, STOPPING, Beacon, Watchdog, start_heartbeat
from jobqueue_worker.maintenance import QueueGauges, Retention, TakingTurns, retention_ages
from jobqueue_worker.pauses import PausedQueues
from jobqueue_worker.periodic import Scheduler
from jobqueue_worker.recovery import Recovery
from jobqueue_worker.served import TypeRecord
from jobqueue_worker.vacuum import Vacuum

log = logging.getLogger("jobqueue.worker")

# Outcomes do not wait for company: a write takes what arrived while the last one ran,
# which under load is a full batch anyway, and a lone job is recorded at once.
_LINGER = 0.0
# The process a SIGTERM reached before the event loop took the signal over. A pid, not a
# flag: the fork server runs this handler too (jobqueue_worker.preload), and what it notes
# for itself must not stop the processes forked from it later.
_stop_requested_in = 0


def early_stop(signum: int, frame: FrameType | None) -> None:
    global _stop_requested_in
    _stop_requested_in = os.getpid()


def main(settings: WorkerSettings, index: int, beacon: Beacon) -> None:
    """Entry point of a spawned worker process; never returns."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, early_stop)  # until the loop installs its own handler
    logs.configure(settings.log_level)
    code = 1
    try:
        load_handlers(settings.job_handlers)
        code = asyncio.run(run(settings, index, beacon))
    except BaseException:
        log.exception("worker process failed", extra={"worker_process": index})
    finally:
        logging.shutdown()
        sys.stdout.flush()
        # os._exit: threads of plain handlers that never returned must not hold the exit.
        os._exit(code)


async def run(settings: WorkerSettings, index: int, beacon: Beacon) -> int:
    with logs.bind(worker_process=index):
        return await _run(settings, index, beacon)


async def _run(settings: WorkerSettings, index: int, beacon: Beacon) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if _stop_requested_in == os.getpid():
        stop.set()
    stop_heartbeat = start_heartbeat(beacon)
    # A worker process is started with its settings, not by main(): the schema too.
    naming.use(settings.database_schema)

    engine = make_engine(
        settings.database_url,
        pool_size=POOL_SIZE,
        connect_timeout=5.0,
        application_name=session_name("jobqueue-worker"),
        # Every store call is a single statement: autocommit spares the BEGIN and COMMIT
        # round trips. No pre-ping either: every failed call is retried, and the pool
        # replaces a connection that failed.
        isolation_level="AUTOCOMMIT",
        pre_ping=False,
    )
    tracer = tracing.start("jobqueue-worker")
    limits = TypeLimits(settings.type_concurrency, settings.type_rate)
    store = PgJobStore(
        engine,
        limits=limits,
        synchronous_commit=settings.worker_synchronous_commit == "on",
        key_concurrency=settings.key_concurrency,
        key_overruns=lambda: executor.key_overruns(),
    )
    recycle = _Recycle(beacon, sum(settings.queues.values()), stop)
    # The slots record through the completer, the completer claims for the dispatcher, the
    # dispatcher fills the slots: a cycle, closed by the two late-bound callbacks below.
    executor = Executor(
        lambda outcome, recorded: completer.add(outcome, recorded),
        slots=settings.queues,
        job_timeout=settings.job_timeout,
        backoff_base=settings.backoff_base,
        backoff_max=settings.backoff_max,
        webhook_allow_private=settings.webhook_allow_private,
        on_slot_freed=lambda queue: dispatcher.slot_freed(queue),
        on_abandoned=recycle.abandoned_changed,
        on_overrun_ended=lambda job: dispatcher.overrun_ended(job),
        max_result_bytes=settings.max_result_bytes,
        tracer=tracer,
    )
    paused = PausedQueues(store, settings.queues, lambda: dispatcher.wake())
    dispatcher = Dispatcher(
        store,
        executor,
        poll_interval=settings.poll_interval,
        lease_seconds=settings.lease_duration,
        limits=limits,
        paused=lambda: paused.paused,
    )
    completer = Completer(
        store, batch_size=sum(settings.queues.values()), linger=_LINGER, claimer=dispatcher
    )
    recovery = Recovery(store, settings.recovery_interval)
    floor_check = FloorCheck(store, list(settings.queues))
    heartbeat = Heartbeat(store, executor, settings.lease_duration)

    def notifications_checked(verdict: str) -> None:
        beacon.set_notifications(verdict)
        if verdict == UNHEARD:
            metrics.notifications_unheard()

    notifications = NotificationCheck(
        store.notification_send, listener="jobqueue-worker", checked=notifications_checked
    )
    listener = Listener(
        settings.listen_url,
        dispatcher.wake,
        cancel=executor.cancel,
        reconnected=heartbeat.nudge,
        pauses=paused.nudge,
        notifications=notifications,
    )
    # Led by one worker process of the database at a time; here, one connection for both.
    turns = TakingTurns(store)
    queue_gauges = QueueGauges(turns)
    retention = Retention(
        turns, retention_ages(settings), batch_interval=PRUNE_BATCH / settings.retention_rate
    )
    history = History(turns, settings.retention_completed)
    vacuum = Vacuum(turns, settings.vacuum_dead_tuples)
    declared = schedules()
    type_record = TypeRecord(store, declared)
    scheduler = (
        Scheduler(engine, declared, max_attempts=settings.max_attempts) if declared else None
    )
    metrics.initialise()
    # What start-up made (modules, SQLAlchemy's tables and caches) lives as long as the
    # process: frozen, full collections stop walking it again and again under load.
    gc.collect()
    gc.freeze()
    # Set when shutdown starts: ends the recovery loop, the scheduler and the maintenance
    # loops (which resign, so another worker takes over at once).
    maintenance_stop = asyncio.Event()
    # Set once every slot is free: jobs finishing during shutdown keep their leases, and hear
    # a cancel request (the listener).
    heartbeat_stop = asyncio.Event()

    watchdog = Watchdog(
        beacon, executor.running_jobs, {"worker_process": index, "pid": os.getpid()}
    )
    watchdog.start()
    beacon.set_state(RUNNING)
    log.info(
        "worker process started",
        extra={
            "pid": os.getpid(),
            "workers": settings.workers,
            "queues": settings.queues,
            **({"type_concurrency": dict(limits.concurrency)} if limits.concurrency else {}),
            **({"type_rate": settings.type_rate} if limits.rate else {}),
            **(
                {"synchronous_commit": "off"} if settings.worker_synchronous_commit == "off" else {}
            ),
        },
    )
    # Before the first claim: a paused queue is not claimed from at start either (if the
    # database cannot say, the loop reads it again soon).
    try:
        await paused.run_once()
    except Exception:
        log.debug("paused queues not read", exc_info=True)
    dispatching = asyncio.create_task(dispatcher.run(), name="dispatcher")
    loops = {
        dispatching,
        asyncio.create_task(completer.run(), name="completer"),
        asyncio.create_task(recovery.run(maintenance_stop), name=recovery.name),
        asyncio.create_task(floor_check.run(maintenance_stop), name=floor_check.name),
        asyncio.create_task(paused.run(maintenance_stop), name=paused.name),
        asyncio.create_task(heartbeat.run(heartbeat_stop), name=heartbeat.name),
        asyncio.create_task(listener.run(heartbeat_stop), name=listener.name),
        asyncio.create_task(queue_gauges.run(maintenance_stop), name=queue_gauges.name),
        asyncio.create_task(retention.run(maintenance_stop), name=retention.name),
        asyncio.create_task(history.run(maintenance_stop), name=history.name),
        asyncio.create_task(vacuum.run(maintenance_stop), name=vacuum.name),
        asyncio.create_task(type_record.run(maintenance_stop), name=type_record.name),
    }
    if scheduler is not None:
        loops.add(asyncio.create_task(scheduler.run(maintenance_stop), name=scheduler.name))
    watcher = asyncio.create_task(_watch_parent(stop))
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({stopped, *loops}, return_when=asyncio.FIRST_COMPLETED)
    broken = [task for task in loops if task in done]
    for task in broken:
        # A bug, not an outage (those are retried inside each loop): restart the process.
        log.error(
            "worker loop ended unexpectedly",
            extra={"loop": task.get_name()},
            exc_info=None if task.cancelled() else task.exception(),
        )

    beacon.set_state(RECYCLING if recycle.requested else STOPPING)
    log.info("worker process stopping", extra={"running": executor.running})
    dispatcher.stop()
    maintenance_stop.set()
    # The dispatcher finishes a claim in flight (bounded by its timeout) and hands it out.
    await asyncio.wait({dispatching})
    await executor.shutdown(settings.shutdown_timeout)
    heartbeat_stop.set()
    completer.close()
    await asyncio.wait(loops)
    metrics.flush()
    watcher.cancel()
    stopped.cancel()
    await store.close()
    await engine.dispose()
    watchdog.stop()
    tracing.stop(tracer)
    stop_heartbeat()
    log.info("worker process stopped")
    return 1 if broken else RECYCLE_EXIT if recycle.requested else 0


class _Recycle:
    """Stops the process once more handlers were abandoned, and still run, than it has slots:
    each may hold a thread, memory and CPU that only the end of the process gives back."""

    def __init__(self, beacon: Beacon, limit: int, stop: asyncio.Event) -> None:
        self._beacon = beacon
        self._limit = limit
        self._stop = stop
        self.requested = False

    def abandoned_changed(self, count: int) -> None:
        self._beacon.set_abandoned(count)
        if count > self._limit and not self.requested and not self._stop.is_set():
            self.requested = True
            log.warning(
                "too many abandoned handlers, recycling the worker process",
                extra={"abandoned_handlers": count, "limit": self._limit},
            )
            self._stop.set()


async def _watch_parent(stop: asyncio.Event) -> None:
    """Stop once the supervisor is gone. The process's parent is the fork server, which
    outlives the supervisor while worker processes run: what tells is multiprocessing's
    sentinel of the process that started this one (the end of a pipe the supervisor holds
    open), readable once the supervisor has exited."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not started by multiprocessing (a test): nothing to watch
        return
    loop = asyncio.get_running_loop()
    gone = asyncio.Event()
    loop.add_reader(parent.sentinel, gone.set)
    try:
        await gone.wait()
    finally:
        loop.remove_reader(parent.sentinel)
    if not stop.is_set():
        log.warning("supervisor is gone, shutting down")
        stop.set()
