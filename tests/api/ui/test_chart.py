"""The chart's statement (`search.JOB_COUNT_FINISHED_PER_MINUTE`): every minute of the last
hour, its counts right, and read as a range of `jobs_finished_idx`, never the whole table."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import search
from jobqueue_api.ui.chart import Bar, chart
from tests.jobcore.test_query_plans import _nodes, _plan
from tests.jobcore.test_search_plans import _analyze, _jobs_rows_read

# Rows finished over the two days before the last hour, and within it.
OLD, RECENT = 60_000, 600


async def _fill(engine: AsyncEngine, old: int, recent: int) -> None:
    """Finished jobs spread over two days, `recent` of them in the last hour; a few pending."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                """
                INSERT INTO jobqueue.jobs
                    (id, type, payload, status, attempts, max_attempts, finished_at)
                SELECT gen_random_uuid(), 'sleep', '{}'::jsonb,
                       CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'completed' END, 1, 3,
                       now() - interval '61 minutes' - (i * interval '2 seconds')
                FROM generate_series(1, :old) AS i
                UNION ALL
                SELECT gen_random_uuid(), 'sleep', '{}'::jsonb,
                       CASE WHEN i % 3 = 0 THEN 'dead_letter' ELSE 'completed' END, 3, 3,
                       now() - (i * interval '5 seconds')
                FROM generate_series(0, :recent - 1) AS i
                UNION ALL
                SELECT gen_random_uuid(), 'sleep', '{}'::jsonb, 'pending', 0, 3, NULL
                FROM generate_series(1, 100) AS i
                """
            ),
            {"old": old, "recent": recent},
        )
        await conn.execute(sa.text("ANALYZE jobqueue.jobs"))


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_the_chart_reads_a_range_of_the_finished_index_never_the_whole_table(engine, generic):
    await _fill(engine, OLD, RECENT)
    plan = await _plan(engine, search.JOB_COUNT_FINISHED_PER_MINUTE, {}, generic)
    reads = [n for n in _nodes(plan) if n.get("Relation Name") == "jobs" or "Index Name" in n]
    assert not [n for n in reads if n["Node Type"] == "Seq Scan"], plan
    indexed = [n for n in reads if "Index Name" in n]
    assert indexed and {n["Index Name"] for n in indexed} == {"jobs_finished_idx"}, plan
    # A range: the index is entered at the hour's first minute.
    assert all("finished_at >=" in n.get("Index Cond", "") for n in indexed), plan


async def test_the_chart_reads_only_the_last_hours_rows(engine):
    await _fill(engine, OLD, RECENT)
    root = await _analyze(engine, search.JOB_COUNT_FINISHED_PER_MINUTE, {})
    assert _jobs_rows_read(root) <= RECENT, json.dumps(root)


async def test_every_minute_of_the_hour_is_a_row_and_each_status_is_counted(engine):
    await _fill(engine, 100, RECENT)
    async with engine.connect() as conn:
        rows = (await conn.execute(search.JOB_COUNT_FINISHED_PER_MINUTE)).all()
    minutes = [row.minute for row in rows]
    assert minutes == sorted(minutes)
    assert len(set(minutes)) == search.CHART_MINUTES
    assert max(minutes) - min(minutes) == timedelta(minutes=search.CHART_MINUTES - 1)
    counts = {(row.minute, row.status): row.finished for row in rows if row.status is not None}
    # 600 jobs, one every 5 s from now back: 50 minutes' worth, every third dead-lettered.
    assert sum(counts.values()) == RECENT
    assert sum(n for (_, status), n in counts.items() if status == "dead_letter") == RECENT // 3
    assert {status for _, status in counts} == {"completed", "dead_letter"}


def test_the_chart_draws_one_bar_per_status_and_minute_scaled_to_the_busiest_minute():
    first = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    rows = [(first + timedelta(minutes=m), None, None) for m in range(search.CHART_MINUTES)]
    rows[10] = (rows[10][0], "completed", 30)
    rows[20:21] = [(rows[20][0], "completed", 10), (rows[20][0], "failed", 50)]
    drawn = chart(rows)
    assert drawn.peak == 60 and drawn.total == 90
    assert drawn.totals == {"completed": 40, "failed": 50}
    tall = [b for b in drawn.bars if b.status == "failed"]
    assert len(tall) == 1 and isinstance(tall[0], Bar)
    stacked = [b for b in drawn.bars if b.minute == rows[20][0]]
    # Stacked: the minute's bars fill the plot's full height together.
    assert sum(b.height for b in stacked) == pytest.approx(drawn.plot_height)
    assert len(drawn.bars) == 3


# --- each queue's hour and the schedules' jobs ------------------------------------------------


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_each_queue_s_hour_reads_the_finished_range_and_the_unfinished_jobs_only(
    engine, generic
):
    await _fill(engine, OLD, RECENT)
    plan = await _plan(engine, search.QUEUE_GET_HOUR, {}, generic)
    reads = [n for n in _nodes(plan) if n.get("Relation Name") == "jobs" or "Index Name" in n]
    assert not [n for n in reads if n["Node Type"] == "Seq Scan"], plan
    used = {n["Index Name"] for n in reads if "Index Name" in n}
    assert "jobs_finished_idx" in used, plan
    assert used <= {
        "jobs_finished_idx",
        "jobs_claim_queue_idx",
        "jobs_claim_key_idx",
        "jobs_lease_idx",
    }, plan


async def test_each_queue_s_hour_reads_no_job_finished_before_the_hour(engine):
    await _fill(engine, OLD, RECENT)
    root = await _analyze(engine, search.QUEUE_GET_HOUR, {})
    # The hour's finished jobs and the 100 pending ones; none of the OLD.
    assert _jobs_rows_read(root) <= RECENT + 100, json.dumps(root)


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_the_schedules_jobs_are_found_through_the_idempotency_key_index(engine, generic):
    await _fill(engine, OLD, 0)
    keys = {"keys": ["periodic:a:2026-01-01T00:00:00Z", "periodic:a:2026-01-01T00:01:00Z"]}
    plan = await _plan(engine, search.JOB_FIND_BY_KEYS, keys, generic)
    reads = [n for n in _nodes(plan) if n.get("Relation Name") == "jobs" or "Index Name" in n]
    assert not [n for n in reads if n["Node Type"] == "Seq Scan"], plan
    assert {n["Index Name"] for n in reads if "Index Name" in n} == {"jobs_idempotency_key_idx"}
