"""One real `jobqueue-api` (with API_TOKENS) and one real `jobqueue-worker` on a database of
their own, shared by the client tests of a test process. Tests keep to their own queues,
types and keys, so they never see each other's jobs."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from tests import pg
from tests.e2e.test_api_process import Api
from tests.worker.support import ROOT, Worker, start_worker

TOKEN = "client-test-token"
# Served by the worker; any other queue holds its jobs pending.
SERVED = "default"


@dataclass
class Stack:
    database_url: str
    api: Api
    worker: Worker

    @property
    def url(self) -> str:
        return self.api.base

    def count(self, sql: str, *args: Any) -> int:
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute(sql, args).fetchone()
            return int(row[0]) if row else 0

    def jobs_in(self, queue: str) -> int:
        return self.count("SELECT count(*) FROM jobs WHERE queue = %s", queue)


@pytest.fixture(scope="session")
def stack(
    pg_server: str, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    name = pg.create_database(pg_server, pg_template)
    url = pg.with_database(pg_server, name)
    api = Api(url, API_TOKENS=TOKEN, JOB_HANDLERS="tests.worker.handlers", PYTHONPATH=str(ROOT))
    worker = start_worker(url, tmp_path_factory.mktemp("client-worker"), QUEUES=SERVED)
    try:
        api.wait_ready()
        yield Stack(url, api, worker)
    finally:
        for service in (api.service, worker):
            with contextlib.suppress(Exception):
                service.stop(10)
        pg.drop_database(pg_server, name)


@pytest.fixture
def queue() -> str:
    """A queue of this test's own that no worker serves: its jobs stay pending."""
    return f"idle-{uuid4().hex[:10]}"


@dataclass
class Scripted:
    """A tiny HTTP server answering from a script of (status, headers, body) in turn (the
    last one repeats), and noting when each request came and its headers."""

    script: list[tuple[int, dict[str, str], bytes]]
    times: list[float] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(*script: tuple[int, dict[str, str], bytes]) -> Scripted:
        state = Scripted(list(script))

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                state.times.append(time.monotonic())
                state.headers.append(dict(self.headers))
                index = min(len(state.times), len(state.script)) - 1
                status, headers, body = state.script[index]
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        return state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
