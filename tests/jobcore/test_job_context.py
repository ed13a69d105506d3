"""`JobContext.cancelled`: one `threading.Event` per attempt, made on first use, set by
`stop()` whether the handler looked at it before or after."""

from __future__ import annotations

import threading

from jobcore import JobContext
from jobcore.ids import new_id


def _ctx() -> JobContext:
    return JobContext(new_id(), "t", 1, 3)


def test_cancelled_is_one_event_set_by_stop_whether_looked_at_before_or_after():
    looked_first = _ctx()
    event = looked_first.cancelled
    assert not event.is_set() and looked_first.cancelled is event
    looked_first.stop()
    assert event.is_set()

    stopped_first = _ctx()
    stopped_first.stop()
    assert stopped_first.cancelled.is_set()
    assert not _ctx().cancelled.is_set()  # each context has its own


def test_a_handler_thread_waiting_on_cancelled_wakes_when_the_attempt_is_stopped():
    for _ in range(200):
        ctx = _ctx()
        woke: list[bool] = []
        ready = threading.Barrier(2)

        def handler(
            ctx: JobContext = ctx, woke: list[bool] = woke, ready: threading.Barrier = ready
        ) -> None:
            ready.wait()
            # First use races the stop() below: either way the wait must end.
            woke.append(ctx.cancelled.wait(5))

        thread = threading.Thread(target=handler)
        thread.start()
        ready.wait()
        ctx.stop()
        thread.join(10)
        assert woke == [True]
