"""Job ids: UUID version 7, unique, and ordered by the millisecond they were made in."""

from __future__ import annotations

import time
import uuid

from jobcore.ids import new_id, new_ids, parse_id


def test_ids_are_version_7_and_unique_across_batches():
    ids = [*new_ids(10_000), *new_ids(10_000), new_id()]
    assert len(set(ids)) == len(ids)
    assert {(i.version, i.variant) for i in ids} == {(7, uuid.RFC_4122)}


def test_an_id_carries_the_millisecond_it_was_made_in_so_later_batches_sort_after():
    before = time.time_ns() // 1_000_000
    first = new_ids(100)
    while time.time_ns() // 1_000_000 == before:
        pass  # the next millisecond: ids only order across milliseconds
    later = new_ids(100)
    after = time.time_ns() // 1_000_000
    assert all(before <= i.int >> 80 <= after for i in first + later)
    assert max(first) < min(later)


def test_a_batchs_ids_increase_so_its_rows_append_at_the_right_of_each_index():
    for _ in range(20):
        ids = new_ids(1_000)
        assert ids == sorted(ids)
        assert str(ids[0]) < str(ids[-1])  # as PostgreSQL orders uuid: by its bytes


def test_the_random_bits_differ_within_one_millisecond():
    ids = new_ids(1_000)
    assert len({i.int & ((1 << 62) - 1) for i in ids}) == len(ids)


def test_parse_id_takes_a_uuid_and_refuses_anything_else():
    job_id = new_id()
    assert parse_id(str(job_id)) == job_id
    assert parse_id("not-a-uuid") is None
