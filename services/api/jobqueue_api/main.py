"""The `jobqueue-api` console script: configuration, startup checks, serving, graceful shutdown.

Exit status: 0 after a graceful shutdown; 2 for invalid configuration (one log
line naming the variable); 1 when the database is unreachable or its schema is
not at head at startup, or HTTP_ADDR cannot be bound; 128 + signal number when
a second signal cuts a shutdown short.

Shutdown on SIGTERM/SIGINT: `/readyz` answers 503 at once, requests are still
served for DRAIN_DELAY (load balancers notice), then the listener closes and
in-flight requests get up to SHUTDOWN_TIMEOUT to finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from jobcore import logs
from jobcore.db import check_schema
from jobcore.errors import ConfigError, SchemaNotAtHead
from jobcore.registry import load_handlers
from jobcore.settings import Settings, load_settings, parse_addr
from jobqueue_api.app import create_app
from jobqueue_api.database import is_unavailable, open_engine

log = logging.getLogger("jobqueue_api")


def hypercorn_config(settings: Settings) -> Config:
    host, port = parse_addr(settings.http_addr)
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None  # RequestContext writes the access log, as JSON
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = settings.shutdown_timeout
    return config


def without_lifespan(app: ASGIApp) -> ASGIApp:
    """Answer the server's lifespan messages here: the app has nothing to start or stop
    (`run` owns the engine), and a failed bind then leaves no half-run lifespan to log."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            await send({"type": f"{message['type']}.complete"})
            if message["type"] == "lifespan.shutdown":
                return

    return wrapped


def _on_signal(app: Starlette, signalled: asyncio.Event, signum: int) -> None:
    name = signal.Signals(signum).name
    if signalled.is_set():
        log.warning("second signal: exiting now", extra={"signal": name})
        sys.stdout.flush()
        os._exit(128 + signum)
    app.state.shutting_down = True
    signalled.set()
    log.info("shutdown requested: /readyz now answers 503", extra={"signal": name})


async def _drained(signalled: asyncio.Event, drain_delay: float) -> None:
    """Hypercorn's shutdown trigger: returns DRAIN_DELAY after the first signal."""
    await signalled.wait()
    await asyncio.sleep(drain_delay)
    log.info("closing the listener; finishing in-flight requests")


async def run(settings: Settings) -> int:
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
            if not is_unavailable(exc):
                raise
            log.error(f"database unreachable at startup: {exc}")
            return 1
        app = create_app(settings, engine)
        signalled = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, _on_signal, app, signalled, signum)
        try:
            await serve(
                without_lifespan(app),  # type: ignore[arg-type]  # ASGI app, other protocol
                hypercorn_config(settings),
                shutdown_trigger=lambda: _drained(signalled, settings.drain_delay),
            )
        except OSError as exc:
            log.error(f"cannot listen on {settings.http_addr} (HTTP_ADDR): {exc}")
            return 1
        log.info("stopped")
        return 0
    finally:
        await engine.dispose()


def main() -> None:
    logs.configure("info")
    try:
        settings = load_settings()
        logs.configure(settings.log_level)
        load_handlers(settings.handler_modules)
    except ConfigError as exc:
        log.error(f"invalid configuration: {exc}", extra={"variable": exc.variable})
        sys.exit(2)
    if not settings.tokens:
        log.warning("API_TOKENS is not set: the /jobs endpoints accept requests without a token")
    log.info("starting", extra={"http_addr": settings.http_addr})
    try:
        status = asyncio.run(run(settings))
    except Exception:  # still one JSON line, with the traceback inside it
        log.exception("jobqueue-api failed")
        status = 1
    sys.exit(status)


if __name__ == "__main__":
    main()
