"""A real HTTP/1.1 (keep-alive) server on 127.0.0.1 that records every request it receives,
and the webhook connection pools closed after each test."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from jobcore.builtin.webhook import close_pools


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int = 0  # one per connection: equal ports mean a reused connection

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Recorder:
    """Answers `/status/<code>`, `/redirect` (302 to `/target`), `/slow`; anything else 200.

    `/then-close` answers 200 as if keeping the connection, then closes it.
    """

    port: int
    requests: list[Received] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)  # client ports of connections it closed

    def url(self, path: str = "/hook", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


def _handler_class(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so that connection reuse shows

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorder.requests.append(
                Received(self.command, self.path, headers, body, self.client_address[1])
            )
            status = 200
            if self.path.startswith("/status/"):
                status = int(self.path.removeprefix("/status/"))
            elif self.path == "/redirect":
                status = 302
            elif self.path == "/slow":
                time.sleep(3)
            self.send_response(status)
            if status == 302:
                self.send_header("Location", f"http://127.0.0.1:{recorder.port}/target")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            if self.path == "/then-close":
                self.close_connection = True

        def finish(self) -> None:
            super().finish()
            recorder.closed.append(self.client_address[1])

        do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _record

    return Handler


def _serve(context: ssl.SSLContext | None = None) -> Iterator[Recorder]:
    recorder = Recorder(port=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(recorder))
    server.daemon_threads = True
    if context is not None:

        def remember(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
            recorder.server_names.append(name)

        context.sni_callback = remember  # type: ignore[assignment]
        server.socket = context.wrap_socket(server.socket, server_side=True)
    recorder.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(autouse=True)
async def _close_webhook_pools() -> AsyncIterator[None]:
    # Each test has an event loop of its own; its pooled connections end with it.
    yield
    await close_pools()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    yield from _serve()


@pytest.fixture
def tls_recorder(tmp_path: Any) -> Iterator[Recorder]:
    """The same server behind TLS with a self-signed certificate for `hooks.example`."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=hooks.example",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    yield from _serve(context)
