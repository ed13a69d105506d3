"""A primary and a synchronous standby, each a throwaway cluster (`tests.chaos.cluster`), for
tests that fail the primary over: `pg_basebackup -R` makes the standby, the primary waits
for it at every commit (nothing it acknowledged is lost when it dies), and `promote` makes
the standby the primary. `freeze` hangs a server instead of stopping it (every process
stopped), `kill_all` ends it, and `rejoin` rewinds a failed primary (pg_rewind) into a
standby of the promoted one."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import psycopg

from tests.chaos.cluster import DATABASE, Cluster

STANDBY_NAME = "standby"
REJOINED_NAME = "rejoined"


# What pg_rewind needs of both servers (a standby copies its primary's configuration):
# hint-bit changes in the WAL, full pages after each checkpoint on the source it reads, and
# the target's WAL back to the last checkpoint before the two diverged (the checkpoint that
# ends its crash recovery would recycle it otherwise).
REWIND_SETTINGS = {"wal_log_hints": "on", "full_page_writes": "on", "wal_keep_size": "'256MB'"}


def allow_rewind(cluster: Cluster) -> None:
    """Configure `cluster` (initialised, not yet started) so pg_rewind can rewind it, and its
    standbys, after a failover."""
    with open(cluster.data / "postgresql.conf", "a") as conf:
        conf.writelines(f"{key} = {value}\n" for key, value in REWIND_SETTINGS.items())


class Standby(Cluster):
    """A cluster whose data directory is a base backup of `primary`, streaming from it under
    the name `name` (its cluster_name, what the primary's synchronous_standby_names names)."""

    def __init__(self, primary: Cluster, name: str = STANDBY_NAME) -> None:
        super().__init__(max_connections=primary.max_connections)
        self.primary = primary
        self.name = name

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
        _own_settings(self, self.name)


def _own_settings(cluster: Cluster, name: str) -> None:
    """After a copy of another server's configuration, `cluster`'s own lines (the later
    lines win): its port and socket, and the name it streams under (the WAL receiver
    reports cluster_name as its application_name).

    A restarted primary holds every commit until its synchronous standby streams again,
    and the standby tries again only every wal_retrieve_retry_interval (5 s by default,
    more than a short lease): here twice a second."""
    settings = {
        "port": str(cluster.port),
        "unix_socket_directories": f"'{cluster.socket_dir}'",
        "cluster_name": f"'{name}'",
        "hot_standby": "on",
        "wal_retrieve_retry_interval": "'500ms'",
    }
    with open(cluster.data / "postgresql.conf", "a") as conf:
        conf.writelines(f"{key} = {value}\n" for key, value in settings.items())


def promote(cluster: Cluster) -> None:
    """Promote the standby `cluster` and wait until it takes writes."""
    cluster._ctl("promote", "-w", "-t", "60")


def make_synchronous(primary: Cluster, name: str, timeout: float = 30) -> None:
    """Have `primary` wait at every commit for its standby `name`, once that one streams
    (caught up: `streaming`, not `catchup`): set before, every commit would wait for it.
    With ALTER SYSTEM, on `primary` alone: a standby copies postgresql.auto.conf only when
    it is made (pg_basebackup, pg_rewind), before this, so once promoted it waits for no one
    until it is told."""
    deadline = time.monotonic() + timeout
    while (state := replication_state(primary, name)) is None or state[0] != "streaming":
        if time.monotonic() > deadline:
            raise AssertionError(f"the standby {name} is not streaming after {timeout}s: {state}")
        time.sleep(0.05)
    with primary.connect() as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
        conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
        conn.execute("SELECT pg_reload_conf()")
    wait_synchronous(primary, name, timeout)


def wait_synchronous(primary: Cluster, name: str, timeout: float = 30) -> None:
    """Wait until the standby `name` streams from `primary` as its synchronous standby: until
    then (after a restart of either, say) every commit on `primary` waits for it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = replication_state(primary, name)
        except psycopg.OperationalError:
            state = None  # not accepting connections yet
        if state == ("streaming", "sync"):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the standby {name} is not synchronous after {timeout}s: {state}")
        time.sleep(0.1)


class Pair:
    """The primary (with the `jobqueue` database) and its synchronous standby, both running;
    `cleanup()` stops and removes both."""

    def __init__(self) -> None:
        self.primary = Cluster(max_connections=100)
        self.standby = Standby(self.primary)

    def start(self) -> None:
        self.primary.init()
        allow_rewind(self.primary)
        self.primary.start()
        self.primary.create_database()
        self.standby.init()
        self.standby.start()
        make_synchronous(self.primary, self.standby.name)

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
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes still alive after SIGKILL: {pids}")
        time.sleep(0.05)


def kill_cluster(cluster: Cluster) -> None:
    """SIGKILL every process of `cluster` at once, as a machine that fails: stopped first,
    so that none notices the others die and exits on its own, nor any is started. Its
    lock files go too: `cleanup` or `rejoin` finds a server that is not running."""
    kill_all(freeze(cluster))
    _clear_stale_locks(cluster)


def _alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (dead, not yet reaped by whoever adopted it) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _clear_stale_locks(cluster: Cluster) -> None:
    """Remove the lock files (data directory, socket) a killed server left. Its pid may
    still be a zombie until whoever adopted it reaps it, and a server starting would take
    that for a server running."""
    for lock in (cluster.data / "postmaster.pid", *cluster.socket_dir.glob(".s.PGSQL.*.lock")):
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            if not _alive(int(lock.read_text().split()[0])):
                lock.unlink()


def rejoin(old: Cluster, new: Cluster, name: str = REJOINED_NAME) -> None:
    """Make `old`, a primary that failed (stopped, by any means) after `new` was promoted
    in its place, a standby of `new`, and start it: pg_rewind takes back what `old` wrote
    that `new` never received, and points it at `new` (standby.signal, primary_conninfo)."""
    with new.connect() as conn:
        # The promotion's timeline is in the control file only after a checkpoint: before
        # it, pg_rewind sees both on one timeline and finds nothing to do.
        conn.execute("CHECKPOINT")
    _clear_stale_locks(old)
    source = f"host=127.0.0.1 port={new.port} user=postgres dbname=postgres"
    # A target not shut down cleanly is first recovered in single-user mode, then rewound;
    # -R: standby.signal, and primary_conninfo appended to postgresql.auto.conf.
    old._run("pg_rewind", "-D", str(old.data), f"--source-server={source}", "-R", "--no-sync")
    # The configuration came from `new` too.
    _own_settings(old, name)
    old.start()


def replication_state(primary: Cluster, name: str) -> tuple[str, str] | None:
    """(state, sync_state) of the standby `name` streaming from `primary`, or None."""
    with primary.connect() as conn:
        row = conn.execute(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
            (name,),
        ).fetchone()
    return (str(row[0]), str(row[1])) if row is not None else None
