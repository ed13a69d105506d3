"""How the supervisor starts worker processes: forked from a fork server that imported the
worker once, while the supervisor was still starting up itself (docs/worker.md, "Start").

`start_server()` runs first thing in `jobqueue-worker`, before the supervisor imports its
own modules: multiprocessing's fork server (a fresh interpreter, method "forkserver")
then imports the worker process's modules (`jobqueue_worker.preload`) on the other core.
Each worker process is a fork of it, so it starts with those modules loaded instead of
importing them again, and a restarted one is up in milliseconds.

Why forking the fork server is safe: it is a fresh interpreter that only imports
modules, and importing them starts no thread, opens no socket, file or database
connection and makes no event loop (`tests/worker/test_launch.py` checks this). A worker
process makes everything with state itself, after the fork: its logging, the
`JOB_HANDLERS` modules (which may start threads), its engine and connections, its event
loop, its tracer. Values that must differ per process are drawn after the fork too (the
`random` module reseeds in a forked child; ids and claim ids come from `os.urandom`), and
prometheus-client's metric files follow the pid they are written from.

The fork server holds no job and no connection; it lives until the supervisor and every
worker process have exited, and one that died is started again by the next `start()`.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
from multiprocessing.context import ForkServerContext
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobcore.settings import WorkerSettings
    from jobqueue_worker.liveness import Beacon

# Exit status of a worker process that recycled itself (too many abandoned handlers).
RECYCLE_EXIT = 3
# The longest a worker process waits for its last spans to be exported as it exits. Its
# event loop does not turn meanwhile: well below the supervisor's SHUTDOWN_STALL_LIMIT, so a
# collector that never answers costs this, not a kill for a stall.
SPAN_FLUSH_LIMIT = 1.0
# "__main__": the console script, which the worker processes would otherwise each run
# again (multiprocessing re-imports the parent's main module in a child).
PRELOAD = ["__main__", "jobqueue_worker.preload"]


def context() -> ForkServerContext:
    return multiprocessing.get_context("forkserver")


def start_server() -> None:
    """Start the fork server now: it imports the worker while the caller goes on.

    Call it before anything changes the environment the worker processes need
    (PROMETHEUS_MULTIPROC_DIR must be set already): they inherit the fork server's.
    """
    context().set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()


def entry(settings: WorkerSettings, index: int, beacon: Beacon) -> None:
    """A worker process's target: referring to it does not import the worker process's
    modules into the supervisor (they are loaded in the fork server already)."""
    from jobcore import tracing
    from jobqueue_worker import child

    tracing.limit_stop(min(settings.shutdown_timeout, SPAN_FLUSH_LIMIT))
    child.main(settings, index, beacon)
