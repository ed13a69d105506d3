"""A handler module for the tests of handler options and recorded types: a type with
options, a schedule of it, and a result that needs the conversions."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any
from uuid import UUID

from jobcore import JobContext, handler, periodic


@handler("test.options.receipt", queue="mail", priority=5, max_attempts=3, timeout="1m")
async def send_receipt(payload: Any, ctx: JobContext) -> dict[str, Any]:
    return {
        "at": dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.UTC),
        "amount": Decimal("9.99"),
        "id": UUID(int=1),
        "pair": (1, 2),
    }


periodic("0 0 1 1 *", "test.options.receipt", payload={"yearly": True}, name="receipt-yearly")
