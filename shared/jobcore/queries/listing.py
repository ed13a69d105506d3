"""`queries.sql`: every statement's SQL as the worker and the API send it (asyncpg's
`$n` parameters), by name, with the parameters each `$n` stands for."""

from __future__ import annotations

from pathlib import Path

from jobcore.queries import named
from jobcore.runner import of

PATH = Path(__file__).with_name("queries.sql")
_HEADER = """\
-- Every statement of jobqueue, by name, as compiled for asyncpg: $n is the n-th parameter
-- listed above it. Generated from jobcore.queries: do not edit; after a change run
--     python -m jobcore.queries
-- (tests/jobcore/test_queries.py fails while this file is stale).
"""


def text() -> str:
    blocks = [_HEADER]
    for name, statement in named().items():
        compiled = of(statement)
        parameters = ", ".join(
            f"${n} {parameter}" for n, parameter in enumerate(compiled.positional, start=1)
        )
        blocks.append(
            f"-- name: {name}\n-- parameters: {parameters or '(none)'}\n{compiled.sql.strip()};\n"
        )
    return "\n".join(blocks)
