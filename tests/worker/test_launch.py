"""What makes forking worker processes from the fork server safe (jobqueue_worker.launch):
its preload leaves nothing behind that a fork would copy into every worker process, and
a SIGTERM it notes for itself stops none of the processes forked from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


def _run(code: str, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_the_preload_starts_no_thread_opens_no_file_or_socket_and_makes_no_event_loop(
    tmp_path,
):
    # As the worker starts it: with the metrics directory set, where a metric made at import
    # would open a file.
    found = _run(
        """
        import asyncio, json, os, threading

        def fds():
            return {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                    if os.path.exists(f"/proc/self/fd/{fd}")}

        before = fds()
        import jobqueue_worker.preload
        after = fds()
        try:
            asyncio.get_running_loop()
            loop = True
        except RuntimeError:
            loop = False
        policy_loop = asyncio.get_event_loop_policy()._local._loop
        print(json.dumps({
            "threads": threading.active_count(),
            "new_fds": sorted(set(after.items()) - set(before.items())),
            "loop": loop or policy_loop is not None,
        }))
        """,
        {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
    )
    assert found == {"threads": 1, "new_fds": [], "loop": False}
    assert list(tmp_path.iterdir()) == []


def test_a_sigterm_the_fork_server_noted_does_not_stop_a_process_forked_after_it():
    found = _run(
        """
        import json, os, signal
        import jobqueue_worker.preload
        from jobqueue_worker import child

        os.kill(os.getpid(), signal.SIGTERM)  # the fork server survives it
        server_noted = child._stop_requested_in == os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            before = child._stop_requested_in == os.getpid()
            os.kill(os.getpid(), signal.SIGTERM)  # before the child's own start-up: noted
            after = child._stop_requested_in == os.getpid()
            os.write(w, json.dumps([before, after]).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        forked = json.loads(os.read(r, 100))
        print(json.dumps({"server_noted": server_noted, "forked": forked}))
        """
    )
    assert found == {"server_noted": True, "forked": [False, True]}
