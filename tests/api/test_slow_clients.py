"""Slow clients against the real `jobqueue-api` process: a body trickled byte by byte is
cut off at REQUEST_BODY_TIMEOUT (408), a request head at the idle timeout, and no more
than MAX_CONNECTIONS connections are held; other clients are served meanwhile."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest

from tests.procs import wait_for

pytestmark = pytest.mark.e2e

HEAD = (
    b"POST /jobs HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n"
)


class Trickler:
    """A connection that sends `first`, then one more byte every `every` seconds."""

    def __init__(self, port: int, first: bytes, every: float, filler: bytes = b" ") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(first)
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, args=(every, filler), daemon=True)
        self._thread.start()

    def _trickle(self, every: float, filler: bytes) -> None:
        while not self._stop.wait(every):
            try:
                self.sock.sendall(filler)
            except OSError:
                return

    def refused(self) -> bool:
        """Whether the server has answered or closed already (data or end of stream to
        read): a connection it holds gets nothing until the body timeout."""
        self.sock.setblocking(False)
        try:
            self.sock.recv(1, socket.MSG_PEEK)
            return True
        except BlockingIOError:
            return False
        except OSError:
            return True
        finally:
            self.sock.settimeout(30)

    def answer(self) -> tuple[bytes, float]:
        """Everything the server sends until it closes, and when it closed."""
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := self.sock.recv(65536):
                received += chunk
        return received, time.monotonic() - self.started

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(5)


def test_a_body_trickled_a_byte_every_2s_gets_408_at_the_body_timeout_others_are_served(start_api):
    server = start_api(REQUEST_BODY_TIMEOUT="5s")
    slow = Trickler(server.port, HEAD + b'{"type":', every=2)
    try:
        # Served meanwhile, on other connections.
        assert server.get("/healthz").status_code == 200
        assert server.post("/jobs", json={"type": "sleep"}).status_code == 201
        received, after = slow.answer()
    finally:
        slow.close()
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert b'{"error":"request body not received within 5s"}' in received
    assert 5 <= after < 9, after

    def logged() -> bool:
        requests = [line for line in server.service.logs() if line["msg"] == "request"]
        return any(line["status"] == 408 and line["path"] == "/jobs" for line in requests)

    wait_for(logged, 10, "the access log line of the 408")


def test_a_request_head_trickled_slowly_is_closed_at_the_idle_timeout(start_api):
    server = start_api()
    slow = Trickler(server.port, b"POST /jobs HTTP/1.1\r\nHost: api\r\n", every=1, filler=b"X")
    try:
        assert server.get("/healthz").status_code == 200
        received, after = slow.answer()
    finally:
        slow.close()
    assert after < 9, after
    assert not received.startswith(b"HTTP/1.1 2"), received[:200]


def test_many_slow_connections_do_not_stop_a_normal_request(start_api):
    server = start_api()
    slow = [Trickler(server.port, HEAD + b"{", every=2) for _ in range(100)]
    try:
        started = time.monotonic()
        created = server.post("/jobs", json={"type": "sleep"})
        assert created.status_code == 201
        assert server.get(created.headers["location"]).status_code == 200
        assert time.monotonic() - started < 3
    finally:
        for conn in slow:
            conn.close()


def test_connections_beyond_max_connections_get_503_and_service_resumes_when_they_close(start_api):
    server = start_api(MAX_CONNECTIONS="5", REQUEST_BODY_TIMEOUT="5m")
    slow = [Trickler(server.port, HEAD + b"{", every=2) for _ in range(5)]
    try:
        # Once the server has accepted all five, each further connection is refused. A probe
        # accepted before one of them takes its place (that one is refused): it is
        # replaced, until five hold the connections.
        answers: list[httpx.Response] = []

        def refused_while_held() -> bool:
            for n, conn in enumerate(slow):
                if conn.refused():
                    conn.close()
                    slow[n] = Trickler(server.port, HEAD + b"{", every=2)
            answers.append(server.get("/healthz"))
            return answers[-1].status_code == 503

        wait_for(refused_while_held, 10, "a 503 while the slow clients hold every connection")
        refused = answers[-1]
        assert refused.json() == {"error": "too many open connections"}
        assert refused.headers["retry-after"] == "1"
    finally:
        for conn in slow:
            conn.close()

    def served() -> bool:
        try:
            return server.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    wait_for(served, 10, "the API to serve again after the slow clients left")
    warnings = [line for line in server.service.logs() if line["level"] == "warning"]
    assert any("connection limit reached" in line["msg"] for line in warnings)


def test_connections_a_client_closed_stop_counting_at_once(start_api):
    """A client that opens a connection per request and closes it after the answer: the
    closed connections must not be counted until their idle timer runs out (5 s)."""
    server = start_api(MAX_CONNECTIONS="10")
    statuses = []
    for _ in range(60):  # six times the limit, within well under the idle timeout
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as client:
            statuses.append(client.get("/healthz").status_code)
    assert statuses == [200] * 60
