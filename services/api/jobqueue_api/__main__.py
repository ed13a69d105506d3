"""`jobqueue-api` and `python -m jobqueue_api`: the API service, once the `server` extra is
known to be installed (else one line naming it, exit 2, `jobcore.extras`)."""

from __future__ import annotations

from jobcore.extras import require


def main() -> None:
    require("server", "jobqueue-api")
    # Imported only now: it imports Starlette and Hypercorn.
    from jobqueue_api.main import main as serve

    serve()


if __name__ == "__main__":
    main()
