"""What the periodic counts (the queue depths, admission's pending counts) share: the queues
present in an index, found from those the reader already knows (`QUEUES_LISTED`,
`queues_present`), and times sent and returned as microseconds (`micros`, `from_micros`).

A loose index scan from the head finds each queue with one probe, but under a held MVCC
horizon the probe for a queue whose jobs all moved on (claimed, finished, moved to the
history) visits every dead entry it left. A reader that knows its queues
(`jobcore.floors.CountFloors`, `:known_queues`) probes only the gaps between them: a probe
after a known queue seeks past its entries, and one bounded by the next known queue stops
at its first entry. Known queues are reported whatever they hold now; with none known
this is the plain loose index scan.
"""

from __future__ import annotations

# The queues the reader knows, in the order the index holds them.
QUEUES_LISTED = """listed AS MATERIALIZED (
    SELECT coalesce(array_agg(q ORDER BY q), '{}') AS qs
    FROM unnest(CAST(:known_queues AS text[])) AS q
)"""


def _step(table: str, where: str, above: str | None, i: str) -> str:
    """The next queue after `above` (None: the first): a present one before the known queue
    at place `i`, else that known queue (and `i` moves on), else, past every known queue, a
    present one. A row (queue, i); none at the end."""
    after = f" AND queue > {above}" if above is not None else ""
    return f"""SELECT * FROM (
            SELECT g.queue, {i} AS i FROM (
                SELECT queue FROM {table} WHERE {where}{after} AND queue < listed.qs[{i}]
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT g.queue, {i} FROM (
                SELECT queue FROM {table} WHERE {where}{after} AND listed.qs[{i}] IS NULL
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT listed.qs[{i}], {i} + 1 WHERE listed.qs[{i}] IS NOT NULL
        ) AS step LIMIT 1"""


def queues_present(name: str, table: str, where: str = "TRUE") -> str:
    """A recursive CTE `name(queue, i)`, for a statement that defines `QUEUES_LISTED`: the
    queues of `table`'s rows matching `where` (an index leading with `queue` serves it) and
    the known queues, each once, in order."""
    return f"""{name}(queue, i) AS (
    SELECT s.queue, s.i FROM listed CROSS JOIN LATERAL ({_step(table, where, None, "1")}) AS s
    UNION ALL
    SELECT s.queue, s.i FROM {name} CROSS JOIN listed
    CROSS JOIN LATERAL ({_step(table, where, f"{name}.queue", f"{name}.i")}) AS s
)"""


def micros(at: str) -> str:
    """A timestamptz as microseconds since the epoch, exactly (`jobcore.floors.micros`)."""
    return f"CAST(extract(epoch FROM {at}) * 1000000 AS bigint)"


def from_micros(param: str) -> str:
    """A microseconds parameter as a timestamptz; NULL as -infinity (read from the head)."""
    return (
        f"coalesce(CAST('epoch' AS timestamptz) + CAST(:{param} AS bigint)"
        " * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))"
    )
