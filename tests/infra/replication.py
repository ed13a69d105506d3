"""A primary and a synchronous standby, each a throwaway cluster (`tests.chaos.cluster`), for
tests that fail the primary over: `pg_basebackup -R` makes the standby, the primary waits
for it at every commit (nothing it acknowledged is lost when it dies), and `promote` makes
the standby the primary."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from tests.chaos.cluster import DATABASE, Cluster

STANDBY_NAME = "standby"
REJOINED_NAME = "rejoined"


class Standby(Cluster):
    """A cluster whose data directory is a base backup of `primary`, streaming from it."""

    def __init__(self, primary: Cluster) -> None:
        super().__init__()
        self.primary = primary

    def init(self) -> None:
        self.socket_dir.mkdir()
        self.root.chmod(0o755)
        if self._user is not None:
            for path in (self.root, self.socket_dir):
                os.chown(path, *self._user)
        host = ("-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres")
        # -R: standby.signal and primary_conninfo; -X stream: the WAL of the backup too;
        # -c fast: its checkpoint at once (a spread one takes minutes).
        self._run(
            "pg_basebackup",
            *host,
            "-D",
            str(self.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        # The later lines win: its own port and socket, and the name the primary waits for
        # (the WAL receiver reports cluster_name as its application_name).
        settings = {
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "cluster_name": f"'{STANDBY_NAME}'",
            "hot_standby": "on",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def promote(self) -> None:
        self._ctl("promote", "-w", "-t", "60")


class Pair:
    """The primary (with the `jobqueue` database) and its synchronous standby, both running;
    `cleanup()` stops and removes both."""

    def __init__(self) -> None:
        self.primary = Cluster(max_connections=100)
        self.standby = Standby(self.primary)

    def start(self) -> None:
        self.primary.init()
        # What pg_rewind needs of both (the standby copies this configuration): hint-bit
        # changes in the WAL, full pages after each checkpoint on the source it reads, and
        # the target's WAL back to the last checkpoint before the two diverged (the
        # checkpoint that ends its crash recovery would recycle it otherwise).
        with open(self.primary.data / "postgresql.conf", "a") as conf:
            conf.write("wal_log_hints = on\nfull_page_writes = on\nwal_keep_size = '256MB'\n")
        self.primary.start()
        self.primary.create_database()
        self.standby.init()
        self.standby.start()
        # Set only now: before the standby streams, every commit would wait for it. Not in
        # the standby's copy of the configuration either, so once promoted it waits for none.
        with self.primary.connect() as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
            conn.execute("SELECT pg_reload_conf()")
        self.wait_sync()

    def wait_sync(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self.primary.connect() as conn:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
            if row is not None and row[0] == "sync":
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby is not synchronous after {timeout}s: {row}")
            time.sleep(0.1)

    def url(self, query: str = "target_session_attrs=read-write") -> str:
        """The libpq multi-host URL naming both servers, the primary first."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{DATABASE}" + (f"?{query}" if query else "")

    def cleanup(self) -> None:
        for cluster in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                cluster.cleanup()
            shutil.rmtree(cluster.root, ignore_errors=True)


def cluster_pids(cluster: Cluster) -> list[int]:
    """The postmaster of `cluster` (from postmaster.pid) and every process it started."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The fields after the command (in parentheses, which may hold spaces): state, ppid.
        if int(stat.rpartition(")")[2].split()[1]) == postmaster:
            children.append(int(entry))
    return [postmaster, *children]


def freeze(cluster: Cluster) -> list[int]:
    """SIGSTOP every process of `cluster`: its sockets stay open, nothing answers (a hung
    machine, no RST). The postmaster first, so that it starts no process meanwhile."""
    frozen: list[int] = []
    while True:
        fresh = [pid for pid in cluster_pids(cluster) if pid not in frozen]
        if not fresh:
            return frozen
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)


def kill_all(pids: list[int]) -> None:
    """SIGKILL `pids` (stopped or not) and wait until they are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes still alive after SIGKILL: {pids}")
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "Z"


def rejoin(old: Cluster, new: Cluster, name: str = REJOINED_NAME) -> None:
    """Make `old`, a primary that failed (stopped, by any means) after `new` was promoted
    in its place, a standby of `new`, and start it: pg_rewind takes back what `old` wrote
    that `new` never received, and points it at `new` (standby.signal, primary_conninfo)."""
    with new.connect() as conn:
        # The promotion's timeline is in the control file only after a checkpoint: before
        # it, pg_rewind sees both on one timeline and finds nothing to do.
        conn.execute("CHECKPOINT")
    source = f"host=127.0.0.1 port={new.port} user=postgres dbname=postgres"
    # A target not shut down cleanly is first recovered in single-user mode, then rewound;
    # -R: standby.signal, and primary_conninfo appended to postgresql.auto.conf.
    old._run("pg_rewind", "-D", str(old.data), f"--source-server={source}", "-R", "--no-sync")
    # The configuration came from `new` too: `old`'s own address and name again.
    settings = {
        "port": str(old.port),
        "unix_socket_directories": f"'{old.socket_dir}'",
        "cluster_name": f"'{name}'",
        "hot_standby": "on",
    }
    with open(old.data / "postgresql.conf", "a") as conf:
        conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
    old.start()


def replication_state(primary: Cluster, name: str) -> tuple[str, str] | None:
    """(state, sync_state) of the standby `name` streaming from `primary`, or None."""
    with primary.connect() as conn:
        row = conn.execute(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
            (name,),
        ).fetchone()
    return (str(row[0]), str(row[1])) if row is not None else None
