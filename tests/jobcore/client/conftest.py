"""One real `jobqueue-api` (with API_TOKENS) and one real `jobqueue-worker` on a database of
their own, shared by the client tests of a test process. Tests keep to their own queues,
types and keys, so they never see each other's jobs."""

from __future__ import annotations

import contextlib
import gc
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit
from uuid import uuid4

import psycopg
import pytest

from jobcore.client import Retries
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
        return self.count("SELECT count(*) FROM jobqueue.jobs WHERE queue = %s", queue)


@pytest.fixture(scope="session")
def stack(
    pg_server: str, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    name = pg.create_database(pg_server, pg_template)
    url = pg.with_database(pg_server, name)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    api = Api(url, API_TOKENS=TOKEN, JOB_HANDLERS="tests.worker.handlers", PYTHONPATH=path)
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


def record(**fields: Any) -> dict[str, Any]:
    """A job record as the API writes it (docs/api.md#jobs): pending, with `fields` over it."""
    now = "2026-12-01T04:13:22.498000+00:00"
    return {
        "id": str(uuid4()),
        "type": "sleep",
        "payload": {},
        "status": "pending",
        "attempts": 0,
        "max_attempts": 5,
        "queue": "default",
        "priority": 0,
        "timeout": None,
        "run_at": now,
        "last_error": None,
        "result": None,
        "cancel_requested_at": None,
        "finished_at": None,
        "created_at": now,
        "updated_at": now,
        **fields,
    }


# A wait's timeout in the tests of waits whose long polls break, and how late it may end.
# The retry budget is far beyond that timeout: the timeout must be what ends the wait.
WAIT, LATE = 1.5, 0.5
PATIENT = Retries(attempts=50, total=60.0, base=0.05, cap=0.2)


@dataclass
class LongPolls:
    """An API whose long polls (`GET ...?wait=`) break: the first `answered` of them get
    `job` at once, every later one is dropped (`drop`: the connection is closed without an
    answer) or held without an answer (`stall`) until the test ends. `polls` notes when
    each came and its `wait`."""

    job: dict[str, Any]
    mode: str
    answered: int
    polls: list[tuple[float, float]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    url: str = ""


@pytest.fixture
def long_polls() -> Iterator[Any]:
    """Starts `LongPolls` servers (in this process). The test process's own garbage
    collections (a full one of pytest's heap takes a tenth of a second and more, several in
    a row) are held off meanwhile: they would pause both the client and the server, and
    the tests time the client."""
    servers: list[tuple[http.server.ThreadingHTTPServer, LongPolls]] = []
    gc.collect()
    gc.disable()

    def start(mode: str, answered: int = 1) -> LongPolls:
        assert mode in ("drop", "stall")
        state = LongPolls(record(), mode, answered)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                state.polls.append((time.monotonic(), float(query.get("wait", ["0"])[0])))
                if len(state.polls) <= state.answered:
                    body = json.dumps(state.job).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if state.mode == "stall":
                    state.released.wait(120)
                self.close_connection = True  # no answer: the connection just closes

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        servers.append((server, state))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        return state

    try:
        yield start
    finally:
        gc.enable()
        for server, state in servers:
            state.released.set()
            server.shutdown()
            server.server_close()


def polls_end_in_time(api: LongPolls, started: float) -> None:
    """No long poll asked the API to hold it past the end of a wait of WAIT seconds that
    started at `started` (give or take the time a request takes to reach the API on a busy
    machine), and a dropped one was tried again."""
    assert api.polls
    assert all(at + wait <= started + WAIT + 0.3 for at, wait in api.polls), api.polls
    if api.mode == "drop":
        assert len(api.polls) > api.answered + 1, api.polls
