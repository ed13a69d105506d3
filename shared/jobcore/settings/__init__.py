"""Configuration from environment variables (docs/configuration.md), validated once at startup.

Three groups, as the documentation's "read by" column has them: `SharedSettings` (both
services), `ApiSettings` and `WorkerSettings` (each the shared ones and the service's own).
A service loads its own with `load_api_settings()` or `load_worker_settings()`, which
ignore the other service's variables, so one environment may serve both.

Fields have the types they mean: the variables' small languages (`QUEUES`, `MAX_PENDING`,
`TYPE_CONCURRENCY`, `TYPE_RATE`, lists, listen addresses, durations) are parsed once, by
the loader (`parsing`). A loader raises `ConfigError` naming the first variable at fault,
so a service can print one line and exit with status 2.
"""

from jobcore.settings.api import ApiSettings, load_api_settings
from jobcore.settings.parsing import (
    MAX_PENDING_CAP,
    Address,
    PendingCaps,
    parse_addr,
    parse_list,
    parse_max_pending,
    parse_queues,
    parse_type_concurrency,
    parse_type_rate,
)
from jobcore.settings.shared import DURATION_LIMITS, SharedSettings
from jobcore.settings.worker import (
    MAX_RESULT_BYTES_LIMIT,
    MIN_LEASE,
    WorkerSettings,
    load_worker_settings,
)

__all__ = [
    "DURATION_LIMITS",
    "MAX_PENDING_CAP",
    "MAX_RESULT_BYTES_LIMIT",
    "MIN_LEASE",
    "Address",
    "ApiSettings",
    "PendingCaps",
    "SharedSettings",
    "WorkerSettings",
    "load_api_settings",
    "load_worker_settings",
    "parse_addr",
    "parse_list",
    "parse_max_pending",
    "parse_queues",
    "parse_type_concurrency",
    "parse_type_rate",
]
