"""The `jobqueue-api` console script: configuration, startup checks, serving, graceful shutdown.

Exit status: 0 after a graceful shutdown; 2 for invalid configuration (one log
line naming the variable); 1 when the database is unreachable or its schema is
not at head at startup, or HTTP_ADDR cannot be bound; 128 + signal number when
a second signal cuts a shutdown short.

Shutdown on SIGTERM/SIGINT: `/readyz` answers 503 at once and waiting requests
(`?wait=`) are answered with their job as it is, requests are still served for
DRAIN_DELAY (load balancers notice), then the listener closes and in-flight
requests get up to SHUTDOWN_TIMEOUT to finish; the spans still buffered (tracing on) are
exported within what is left of it, and dropped past it.

Slow clients: a connection must send its request head within IDLE_TIMEOUT of
opening (or of its previous response), and the body within REQUEST_BODY_TIMEOUT
(`LimitBody`); a process holds at most MAX_CONNECTIONS client connections, and
answers further ones 503 at once, so a crowd of slow clients cannot take every
file descriptor (the database pool needs some too).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
import time
from typing import TYPE_CHECKING

import hypercorn.asyncio.run
from hypercorn.asyncio import serve
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from jobcore import environ, logs, naming, tracing
from jobcore.db import check_schema
from jobcore.errors import (
    POOLER_HINT,
    ConfigError,
    SchemaNotAtHead,
    describe,
    pooled_statements_lost,
)
from jobcore.registry import load_handlers
from jobcore.settings import ApiSettings, load_api_settings
from jobqueue_api import processes
from jobqueue_api.app import close, create_app, shut_down
from jobqueue_api.database import is_unavailable, open_engine

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger("jobqueue.api")

# An open connection with no request in progress, or with a request head still
# incomplete, is closed after this long (Hypercorn's keep-alive timer covers both).
IDLE_TIMEOUT = 5.0
# File descriptors kept beyond MAX_CONNECTIONS: the database pool, the listener, logs.
FD_HEADROOM = 64
_REFUSED_BODY = b'{"error":"too many open connections"}'
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)


def hypercorn_config(settings: ApiSettings) -> Config:
    host, port = settings.http_addr
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    inherited = os.environ.get(processes.LISTEN_FD)
    if inherited is not None:  # one of API_PROCESSES: the supervisor's socket
        config.bind = [f"fd://{int(inherited)}"]
    config.accesslog = None  # RequestContext writes the access log, as JSON
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = settings.shutdown_timeout
    config.keep_alive_timeout = IDLE_TIMEOUT
    return config


def ensure_fd_limit(max_connections: int, *, explicit: bool = True) -> int:
    """Raise the soft open-files limit to fit MAX_CONNECTIONS, or refuse the setting; returns
    the connection limit to use. The default, not chosen by the operator, shrinks to fit
    the hard limit instead of refusing to start."""
    needed = max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            if not explicit and hard > 2 * FD_HEADROOM:
                log.warning(
                    "MAX_CONNECTIONS lowered to fit the open-files limit",
                    extra={"max_connections": hard - FD_HEADROOM, "open_files_limit": hard},
                )
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                return int(hard - FD_HEADROOM)
            raise ConfigError(
                environ.variable("MAX_CONNECTIONS"),
                f"{max_connections} connections need {needed} file descriptors, "
                f"but this process may open at most {hard} (ulimit -n)",
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return max_connections


def cap_connections(limit: int) -> None:
    """Make Hypercorn's asyncio server hold at most `limit` client connections.

    Hypercorn has no such setting: its per-connection class is replaced by one that
    answers a connection over the limit with a 503 and closes it, before reading it.
    """

    class Capped(TCPServer):
        open = 0
        refusing = False

        async def run(self) -> None:
            if Capped.open >= limit:
                if not Capped.refusing:
                    Capped.refusing = True
                    log.warning(
                        "connection limit reached: refusing connections",
                        extra={"max_connections": limit},
                    )
                self.writer.write(_REFUSAL)
                self.writer.close()
                return
            if Capped.refusing and Capped.open < limit * 0.9:
                Capped.refusing = False
                log.info("accepting connections again", extra={"open_connections": Capped.open})
            Capped.open += 1
            try:
                await super().run()
            finally:
                Capped.open -= 1

        async def _read_data(self) -> None:
            await super()._read_data()
            # The client closed its side. Hypercorn would keep the connection (and count it)
            # until its idle timer ran out, KEEP_ALIVE seconds later; end that timer now.
            await self.idle_task.stop()

    hypercorn.asyncio.run.TCPServer = Capped  # type: ignore[attr-defined]


def without_lifespan(app: ASGIApp) -> ASGIApp:
    """Answer the server's lifespan messages here: the app has nothing to start or stop
    (`run` owns the engine), and a failed bind then leaves no half-run lifespan to log."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        # Startup only: returning ends Hypercorn's lifespan task now, so a bind that fails
        # right after leaves no pending task for the garbage collector to log (Hypercorn
        # counts the shutdown as done once the task has ended).
        await receive()
        await send({"type": "lifespan.startup.complete"})

    return wrapped


def _on_signal(app: Starlette, signalled: asyncio.Event, signum: int) -> None:
    name = signal.Signals(signum).name
    if signalled.is_set():
        log.warning("second signal: exiting now", extra={"signal": name})
        sys.stdout.flush()
        os._exit(128 + signum)
    shut_down(app)
    signalled.set()
    log.info("shutdown requested: /readyz now answers 503", extra={"signal": name})


class Budget:
    """SHUTDOWN_TIMEOUT, counted from the moment the listener closes (DRAIN_DELAY after the
    first signal): in-flight requests take what they need of it, the span flush the rest."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends: float | None = None

    def start(self) -> None:
        self.ends = time.monotonic() + self.seconds

    def remaining(self) -> float:
        """What is left of it; all of it before it started (a stop without a signal)."""
        if self.ends is None:
            return self.seconds
        return max(0.0, self.ends - time.monotonic())


async def _drained(signalled: asyncio.Event, drain_delay: float, budget: Budget) -> None:
    """Hypercorn's shutdown trigger: returns DRAIN_DELAY after the first signal."""
    await signalled.wait()
    await asyncio.sleep(drain_delay)
    budget.start()
    log.info("closing the listener; finishing in-flight requests")


async def run(
    settings: ApiSettings, tracer: Tracer | None = None, budget: Budget | None = None
) -> int:
    budget = budget or Budget(settings.shutdown_timeout)
    try:
        engine = open_engine(settings.database_url)
    except Exception as exc:  # a URL the validator let through but SQLAlchemy cannot parse
        log.error(f"invalid configuration: DATABASE_URL: {exc}", extra={"variable": "DATABASE_URL"})
        return 2
    try:
        try:
            await check_schema(engine)
        except SchemaNotAtHead as exc:
            log.error(str(exc))
            return 1
        except Exception as exc:
            if pooled_statements_lost(exc):
                first = describe(exc).splitlines()[0][:300]
                log.error(f"database unusable through its pooler: {first} ({POOLER_HINT})")
                return 1
            if not is_unavailable(exc):
                raise
            log.error(f"database unreachable at startup: {exc}")
            return 1
        app = create_app(settings, engine, tracer)
        signalled = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, _on_signal, app, signalled, signum)
        cap_connections(settings.max_connections)
        try:
            await serve(
                without_lifespan(app),  # type: ignore[arg-type]  # ASGI app, other protocol
                hypercorn_config(settings),
                shutdown_trigger=lambda: _drained(signalled, settings.drain_delay, budget),
            )
        except OSError as exc:
            log.error(
                f"cannot listen on {settings.http_addr} ({environ.variable('HTTP_ADDR')}): {exc}"
            )
            return 1
        finally:
            await close(app)
            # In a thread, bounded: the loop still takes a second signal meanwhile.
            await asyncio.to_thread(tracing.stop, tracer, budget.remaining())
        log.info("stopped")
        return 0
    finally:
        await engine.dispose()


def main() -> None:
    logs.configure("info")
    try:
        settings = load_api_settings()
        naming.use(settings.database_schema)
        logs.configure(settings.log_level)
        load_handlers(settings.job_handlers)
        limit = ensure_fd_limit(
            settings.max_connections, explicit="max_connections" in settings.model_fields_set
        )
        settings = settings.model_copy(update={"max_connections": limit})
        tracing.check()
        supervising = settings.api_processes > 1 and processes.LISTEN_FD not in os.environ
        tracer = None if supervising else tracing.start("jobqueue-api")
    except ConfigError as exc:
        log.error(f"invalid configuration: {exc}", extra={"variable": exc.variable})
        sys.exit(2)
    if supervising:
        sys.exit(processes.supervise(settings))
    if not settings.api_tokens:
        log.warning("API_TOKENS is not set: the /jobs endpoints accept requests without a token")
    log.info("starting", extra={"http_addr": str(settings.http_addr), "pid": os.getpid()})
    budget = Budget(settings.shutdown_timeout)
    try:
        status = asyncio.run(run(settings, tracer, budget))
    except Exception:  # still one JSON line, with the traceback inside it
        log.exception("jobqueue-api failed")
        status = 1
    tracing.stop(tracer, budget.remaining())  # unless `run` did already
    sys.exit(status)


if __name__ == "__main__":
    main()
