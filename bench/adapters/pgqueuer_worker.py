"""What `pgq run bench.adapters.pgqueuer_app:create_pgqueuer` does, at its defaults.

PgQueuer 1.6's `pgq run` fails on current typer while parsing its own default
`--log-level` (a string where an enum is expected), so this runs the same
three steps the command runs: its logger at INFO, `pgqueuer.run(factory)` with
the default options, on the event loop the CLI picks (uvloop when installed).
"""

from __future__ import annotations

from pgqueuer import run
from pgqueuer.adapters.cli.cli import asyncio_run
from pgqueuer.core import logconfig

FACTORY = "bench.adapters.pgqueuer_app:create_pgqueuer"


def main() -> None:
    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)
    asyncio_run(run(FACTORY))


if __name__ == "__main__":
    main()
