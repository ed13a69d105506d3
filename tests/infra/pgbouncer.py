"""A real PgBouncer in front of a PostgreSQL server, for tests that run the services through a
pooler: its configuration (every database of the server, trust authentication as the server
uses, a small pool so clients really share server connections), its process on a free
loopback port, its URLs and its admin console (`SHOW STATS`, `SHOW POOLS`).

PgBouncer refuses to run as root: as root, it runs as the `postgres` OS user."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from tests.procs import free_port

VERSION = "1.24.1"
# Where scripts/install-pgbouncer.sh (run by `make tools`) puts them.
CURRENT = Path(f"/opt/jobqueue-tools/pgbouncer-{VERSION}/bin/pgbouncer")
LEGACY = Path("/usr/sbin/pgbouncer")  # Debian 12's package: 1.18
# The users the tests connect as: the OS user's name (the local URL names none) and postgres.
USERS = ("root", "postgres")


def binary(path: Path) -> Path:
    """`path` if it is there; else fail, saying how to install it."""
    if not os.access(path, os.X_OK):
        raise AssertionError(f"{path} is missing: run `make tools` (scripts/install-pgbouncer.sh)")
    return path


def _as_postgres() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


class PgBouncer:
    """One PgBouncer process under a temporary directory; `start()` returns once it accepts
    connections, `stop()` ends it and removes its files. Also a context manager."""

    def __init__(
        self,
        program: Path,
        pool_mode: str = "session",
        *,
        server_port: int = 5432,
        default_pool_size: int = 2,
        max_prepared_statements: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.program = binary(program)
        self.pool_mode = pool_mode
        self.port = free_port()
        self.server_port = server_port
        self.root = Path(tempfile.mkdtemp(prefix="jobqueue-pgbouncer-"))
        self.log = self.root / "pgbouncer.log"
        self._user = _as_postgres()
        self.proc: subprocess.Popen[bytes] | None = None
        config = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            # Trust still needs each user listed here; the passwords are not checked.
            "auth_file": str(self.root / "userlist.txt"),
            "admin_users": ", ".join(USERS),
            "pool_mode": pool_mode,
            "default_pool_size": str(default_pool_size),
            "max_client_conn": "500",
            "pidfile": str(self.root / "pgbouncer.pid"),
            **({} if settings is None else settings),
        }
        if max_prepared_statements is not None:
            config["max_prepared_statements"] = str(max_prepared_statements)
        self.config = config

    # --- lifecycle -----------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        (self.root / "userlist.txt").write_text("".join(f'"{user}" ""\n' for user in USERS))
        lines = [
            "[databases]",
            f"* = host=127.0.0.1 port={self.server_port}",
            "[pgbouncer]",
            *(f"{key} = {value}" for key, value in self.config.items()),
        ]
        (self.root / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        self.root.chmod(0o755)
        if self._user is not None:
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, *self._user)
        uid, gid = self._user if self._user is not None else (None, None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.program), str(self.root / "pgbouncer.ini")],
                user=uid,
                group=gid,
                extra_groups=None if uid is None else [],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{self.output()}")
            try:
                self.show("VERSION")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def stop(self, timeout: float = 10) -> None:
        """End the process (SIGTERM: clients' connections closed, then SIGKILL if it lingers)
        and remove its directory."""
        if self.proc is not None and self.proc.poll() is None:
            # 1.18 shuts down at once on SIGTERM; 1.23 and later wait for their clients,
            # which a stopping test has closed already (SIGKILL else).
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")
        return ""

    # --- addresses ------------------------------------------------------------------

    def url(self, direct_url: str) -> str:
        """`direct_url` (a URL of the server behind it) with PgBouncer's host and port."""
        return (
            make_url(direct_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    def connect(
        self, database: str, user: str = "root", autocommit: bool = True, **kwargs: Any
    ) -> psycopg.Connection:
        """A client connection through PgBouncer."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            dbname=database,
            autocommit=autocommit,
            connect_timeout=5,
            **kwargs,
        )

    # --- admin console --------------------------------------------------------------

    def show(self, what: str) -> list[dict[str, Any]]:
        """The rows of the admin console's `SHOW <what>` (STATS, POOLS, CLIENTS, ...). The
        console speaks only the simple query protocol: a client-side-binding cursor."""
        with (
            psycopg.connect(
                host="127.0.0.1",
                port=self.port,
                user="postgres",
                dbname="pgbouncer",
                autocommit=True,
                connect_timeout=5,
                cursor_factory=psycopg.ClientCursor,
            ) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(f"SHOW {what}")
            names = [column.name for column in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def stats(self, database: str) -> dict[str, Any]:
        """`SHOW STATS`'s row of `database` (totals since start: xact, query, bytes), or {}."""
        for row in self.show("STATS"):
            if row["database"] == database:
                return row
        return {}

    def pools(self, database: str) -> list[dict[str, Any]]:
        """`SHOW POOLS`'s rows of `database` (one per user)."""
        return [row for row in self.show("POOLS") if row["database"] == database]
