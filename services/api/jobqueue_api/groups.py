"""Submit groups: the single submits one API process receives while its submit statements are
busy go to the database together, as one statement (docs/api.md#submit-groups).

Each `POST /jobs` used to cost a database round trip of its own, the largest part of the
API's CPU per request after HTTP itself, and a commit (a WAL flush) of the database's.
Here a submit without an idempotency key joins the waiting group; at most `FLIGHTS`
groups are in flight at once, and a group leaves as soon as a flight is free, so a lone
request still goes alone and at once, and under load the requests that arrived during one
round trip share the next (no timer: nothing waits for company). A group is one
`queries.JOB_SUBMIT_GROUP` statement, one commit; every request still gets its own job, exactly
as it would alone.

A submit with an idempotency key always goes alone (`calls.submit`): its answer depends on
the row it may conflict with. A group whose statement failed once sent (its connection died,
the database refused a row) is tried again one request at a time, each as a retry
(`again`): a request whose job the group did write finds it by its id. A request whose
deadline passed before its group left is answered with a timeout (503), its job not written;
a group's statement is bounded by its latest member's deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import NamedTuple

import sqlalchemy.exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.rows import Job, NewJob
from jobcore.runner import Driver
from jobqueue_api import calls
from jobqueue_api.database import on_driver
from jobqueue_api.notify import Notifier

# Groups in flight at once per process: two, so one group's round trip overlaps the next
# group's gathering; more would split the load into smaller groups for no gain.
FLIGHTS = 2
# Jobs per statement at most: a group's bind arrays and its answer stay small.
GROUP_MAX = 256


class _Member(NamedTuple):
    new: NewJob
    answer: asyncio.Future[tuple[Job, bool]]
    deadline: float


class SubmitGroups:
    """One per app (`state_of(app).groups`): `await groups.submit(new, deadline)`."""

    def __init__(self, engine: AsyncEngine, notifier: Notifier) -> None:
        self._engine = engine
        self._notifier = notifier
        self._waiting: list[_Member] = []
        self._flights: set[asyncio.Task[None]] = set()

    async def submit(self, new: NewJob, deadline: float) -> tuple[Job, bool]:
        """Create `new`, or find the job its idempotency key names: (job, created), the job
        committed. Raises IdempotencyConflict, TimeoutError after `deadline` (loop time),
        or the database's error."""
        if new.idempotency_key is not None:
            async with asyncio.timeout_at(deadline):
                return await self._submit_alone(new, again=False)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[Job, bool]] = loop.create_future()
        self._waiting.append(_Member(new, answer, deadline))
        if len(self._flights) < FLIGHTS:
            # A task, so it leaves on the loop's next turn with whatever joined by then; in a
            # context of its own, so its work is not logged or traced as this request's.
            flight = loop.create_task(self._fly(), context=contextvars.Context())
            self._flights.add(flight)
        # No timeout of its own: a flight takes every waiting member before it ends, answers
        # one whose deadline has passed with a timeout, and its statement is bounded too.
        return await answer

    async def close(self) -> None:
        """Let the groups in flight finish (each bounded by its members' deadlines)."""
        if self._flights:
            await asyncio.wait(set(self._flights))

    async def _fly(self) -> None:
        try:
            while self._waiting:
                taken = self._waiting[:GROUP_MAX]
                del self._waiting[:GROUP_MAX]
                now = asyncio.get_running_loop().time()
                group = []
                for member in taken:
                    if member.answer.done():  # its request was cancelled (the client left)
                        continue
                    if member.deadline <= now:
                        member.answer.set_exception(TimeoutError())
                        continue
                    group.append(member)
                if len(group) == 1:
                    await self._answer_alone(group[0], again=False)
                elif group:
                    await self._many(group)
        finally:
            # At once, with no await since `_waiting` was last found empty: a member that
            # joins from here on finds a free flight and starts one.
            self._flights.discard(asyncio.current_task())

    async def _many(self, group: list[_Member]) -> None:
        inline = self._notifier.inline()
        news = [member.new for member in group]
        try:
            # The latest deadline: one member close to its own must not cut the statement
            # short for all the others (which would answer 503 for jobs perhaps written).
            async with asyncio.timeout_at(max(member.deadline for member in group)):
                jobs = await on_driver(
                    self._engine,
                    lambda conn, again: calls.submit_group(conn, news, notify=inline),
                    retry=False,
                )
        except TimeoutError:
            for member in group:
                _answer(member, exc=TimeoutError())
            return
        except sa_exc.SQLAlchemyError as exc:
            # No connection to be had (the pool's wait, a failed connect): nothing was sent.
            for member in group:
                _answer(member, exc=exc)
            return
        except Exception:
            # One at a time, each as a retry: the group may have been written before its
            # connection died, or one member's row may be what the database refused.
            waiting = [member for member in group if not member.answer.done()]
            await asyncio.gather(*(self._answer_alone(m, again=True) for m in waiting))
            return
        if not inline:
            self._notifier.jobs_due()
        for member, job in zip(group, jobs, strict=True):
            _answer(member, (job, True))

    async def _answer_alone(self, member: _Member, *, again: bool) -> None:
        try:
            async with asyncio.timeout_at(member.deadline):
                result = await self._submit_alone(member.new, again=again)
        except Exception as exc:
            _answer(member, exc=exc)
        else:
            _answer(member, result)

    async def _submit_alone(self, new: NewJob, *, again: bool) -> tuple[Job, bool]:
        inline = self._notifier.inline()

        async def call(conn: Driver, retried: bool) -> tuple[Job, bool]:
            return await calls.submit(conn, new, notify=inline, again=again or retried)

        # Retried on a fresh connection if the first one was dead: the job's id makes
        # the second try find the job the first one may have written.
        job, created = await on_driver(self._engine, call, retry=True)
        if created and not inline:
            self._notifier.jobs_due()
        return job, created


def _answer(
    member: _Member,
    result: tuple[Job, bool] | None = None,
    exc: BaseException | None = None,
) -> None:
    if member.answer.done():  # cancelled meanwhile: nobody is waiting for it
        return
    if exc is not None:
        member.answer.set_exception(exc)
    else:
        assert result is not None
        member.answer.set_result(result)
