"""Every statement of jobqueue, one SQLAlchemy Core construct each, named Noun_Verb_Qualifier
after the table it works on and what it does (`JOB_CLAIM`, `JOB_SET_OUTCOME[operation]`,
`JOB_RENEW_MANY`, `LEAD_TAKE`, ...), grouped by table and concern:

- `job_submit`: writing new jobs (one, a batch, a group) and reading back replays;
- `job_read`: one job, the capped queues' pending counts, stored keys, the wake-up;
- `job_claim`: the claims (from the floors, keys in turn or plain, with completions);
- `job_claim_limited`: the claim under per-type limits;
- `job_outcome`: the writes that end or extend an attempt, and recovery;
- `job_types`: the types the workers serve, recorded by them and read by the submitters;
- `jobcore.control`, `jobcore.bulk`, `jobcore.pauses`, `jobcore.search`,
  `jobcore.maintenance`, `jobcore.notifications`: an operator's actions (on one job, on
  many, on a queue), the lists and depths, the maintenance leases, retention and table
  statistics, the listeners' notification check.

`named()` lists them all by their SQL name (`job_claim`, `job_set_outcome_complete`, ...):
`jobcore.compiled` compiles them once from there, and `queries.sql` beside this package is
their SQL as the worker and the API send it, written out by `python -m jobcore.queries`
(a test fails when it is stale), so a change's SQL reads as a diff.
"""

from __future__ import annotations

from typing import Any

from jobcore.queries.common import (
    FINISHED_CHANNEL,
    JOB_COLUMNS,
    NOTIFY_CHANNEL,
    guard,
    status_in,
    status_literal,
)
from jobcore.queries.job_claim import (
    JOB_CLAIM,
    JOB_CLAIM_HEADS,
    JOB_CLAIM_KEY_FLOORS,
    JOB_CLAIM_PLAIN,
    JOB_CLAIM_PLAIN_UNLIMITED,
    JOB_CLAIM_UNLIMITED,
    JOB_CLAIM_UNLIMITED_KEY_FLOORS,
    JOB_COMPLETE_AND_CLAIM,
    JOB_COMPLETE_AND_CLAIM_KEY_FLOORS,
    JOB_COMPLETE_AND_CLAIM_PLAIN,
    JOB_COMPLETE_AND_CLAIM_PLAIN_UNLIMITED,
    JOB_COMPLETE_AND_CLAIM_UNLIMITED,
    JOB_COMPLETE_AND_CLAIM_UNLIMITED_KEY_FLOORS,
    JOB_KEY_LEASE_FIRST,
    JOB_LOCK_KEYS,
    JOB_NEXT_DUE,
    TABLE_COUNT_CLAIM_READS,
)
from jobcore.queries.job_claim_limited import JOB_CLAIM_LIMITED, JOB_LOCK_TYPES
from jobcore.queries.job_outcome import (
    JOB_RECOVER_EXPIRED,
    JOB_RELEASE_CLAIM,
    JOB_RENEW_MANY,
    JOB_SET_OUTCOME,
    RECOVER_BATCH,
)
from jobcore.queries.job_read import JOB_COUNT_PENDING, JOB_FIND_KEYS, JOB_GET, JOB_NOTIFY
from jobcore.queries.job_submit import (
    JOB_MATCH_REQUESTS,
    JOB_SUBMIT,
    JOB_SUBMIT_GROUP,
    JOB_SUBMIT_GROUP_NOTIFY,
    JOB_SUBMIT_MANY,
    JOB_SUBMIT_MANY_KEYLESS,
    JOB_SUBMIT_NOTIFY,
    keyless_params,
    many_params,
    submit_params,
)
from jobcore.queries.job_types import JOB_TYPE_FIND, JOB_TYPE_LIST, JOB_TYPE_RECORD

__all__ = [
    "FINISHED_CHANNEL",
    "JOB_CLAIM",
    "JOB_CLAIM_HEADS",
    "JOB_CLAIM_KEY_FLOORS",
    "JOB_CLAIM_LIMITED",
    "JOB_CLAIM_PLAIN",
    "JOB_CLAIM_PLAIN_UNLIMITED",
    "JOB_CLAIM_UNLIMITED",
    "JOB_CLAIM_UNLIMITED_KEY_FLOORS",
    "JOB_COLUMNS",
    "JOB_COMPLETE_AND_CLAIM",
    "JOB_COMPLETE_AND_CLAIM_KEY_FLOORS",
    "JOB_COMPLETE_AND_CLAIM_PLAIN",
    "JOB_COMPLETE_AND_CLAIM_PLAIN_UNLIMITED",
    "JOB_COMPLETE_AND_CLAIM_UNLIMITED",
    "JOB_COMPLETE_AND_CLAIM_UNLIMITED_KEY_FLOORS",
    "JOB_COUNT_PENDING",
    "JOB_FIND_KEYS",
    "JOB_GET",
    "JOB_KEY_LEASE_FIRST",
    "JOB_LOCK_KEYS",
    "JOB_LOCK_TYPES",
    "JOB_MATCH_REQUESTS",
    "JOB_NEXT_DUE",
    "JOB_NOTIFY",
    "JOB_RECOVER_EXPIRED",
    "JOB_RELEASE_CLAIM",
    "JOB_RENEW_MANY",
    "JOB_SET_OUTCOME",
    "JOB_SUBMIT",
    "JOB_SUBMIT_GROUP",
    "JOB_SUBMIT_GROUP_NOTIFY",
    "JOB_SUBMIT_MANY",
    "JOB_SUBMIT_MANY_KEYLESS",
    "JOB_SUBMIT_NOTIFY",
    "JOB_TYPE_FIND",
    "JOB_TYPE_LIST",
    "JOB_TYPE_RECORD",
    "NOTIFY_CHANNEL",
    "RECOVER_BATCH",
    "TABLE_COUNT_CLAIM_READS",
    "guard",
    "keyless_params",
    "many_params",
    "named",
    "status_in",
    "status_literal",
    "submit_params",
]


def named() -> dict[str, Any]:
    """Every statement by its SQL name, in a stable order."""
    from jobcore import bulk, control, history, maintenance, notifications, pauses, search

    found: dict[str, Any] = {
        "job_submit": JOB_SUBMIT,
        "job_submit_notify": JOB_SUBMIT_NOTIFY,
        "job_submit_many": JOB_SUBMIT_MANY,
        "job_submit_many_keyless": JOB_SUBMIT_MANY_KEYLESS,
        "job_submit_group": JOB_SUBMIT_GROUP,
        "job_submit_group_notify": JOB_SUBMIT_GROUP_NOTIFY,
        "job_match_requests": JOB_MATCH_REQUESTS,
        "job_get": JOB_GET,
        "job_count_pending": JOB_COUNT_PENDING,
        "job_find_keys": JOB_FIND_KEYS,
        "job_notify": JOB_NOTIFY,
        "job_claim": JOB_CLAIM,
        "job_claim_unlimited": JOB_CLAIM_UNLIMITED,
        "job_complete_and_claim": JOB_COMPLETE_AND_CLAIM,
        "job_complete_and_claim_unlimited": JOB_COMPLETE_AND_CLAIM_UNLIMITED,
        "job_claim_key_floors": JOB_CLAIM_KEY_FLOORS,
        "job_complete_and_claim_key_floors": JOB_COMPLETE_AND_CLAIM_KEY_FLOORS,
        "job_claim_unlimited_key_floors": JOB_CLAIM_UNLIMITED_KEY_FLOORS,
        "job_complete_and_claim_unlimited_key_floors": JOB_COMPLETE_AND_CLAIM_UNLIMITED_KEY_FLOORS,
        "job_claim_plain": JOB_CLAIM_PLAIN,
        "job_claim_plain_unlimited": JOB_CLAIM_PLAIN_UNLIMITED,
        "job_complete_and_claim_plain": JOB_COMPLETE_AND_CLAIM_PLAIN,
        "job_complete_and_claim_plain_unlimited": JOB_COMPLETE_AND_CLAIM_PLAIN_UNLIMITED,
        "job_lock_keys": JOB_LOCK_KEYS,
        "job_lock_types": JOB_LOCK_TYPES,
        "job_claim_limited": JOB_CLAIM_LIMITED,
        "job_next_due": JOB_NEXT_DUE,
        "job_claim_heads": JOB_CLAIM_HEADS,
        "job_key_lease_first": JOB_KEY_LEASE_FIRST,
        "table_count_claim_reads": TABLE_COUNT_CLAIM_READS,
        **{f"job_set_outcome_{op}": statement for op, statement in JOB_SET_OUTCOME.items()},
        "job_renew_many": JOB_RENEW_MANY,
        "job_release_claim": JOB_RELEASE_CLAIM,
        "job_recover_expired": JOB_RECOVER_EXPIRED,
        "job_type_record": JOB_TYPE_RECORD,
        "job_type_list": JOB_TYPE_LIST,
        "job_type_find": JOB_TYPE_FIND,
    }
    found.update(control.NAMED)
    found.update(search.NAMED)
    found.update(maintenance.NAMED)
    found.update(pauses.NAMED)
    found.update(bulk.NAMED)
    found.update(history.NAMED)
    found["notification_send"] = notifications.NOTIFICATION_SEND
    return found
