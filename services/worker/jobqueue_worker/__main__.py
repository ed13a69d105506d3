"""`jobqueue-worker` and `python -m jobqueue_worker`: the worker supervisor, once the
`server` extra is known to be installed (else one line naming it, exit 2,
`jobcore.extras`)."""

from __future__ import annotations

from jobcore.extras import require


def main() -> None:
    require("server", "jobqueue-worker")
    from jobqueue_worker.main import main as supervise

    supervise()


if __name__ == "__main__":
    main()
