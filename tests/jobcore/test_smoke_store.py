from jobcore import compiled, store
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.states import Operation
from tests.pg import driver


async def test_submitted_job_can_be_claimed_and_completed(engine):
    async with engine.begin() as conn:
        job, created = await store.submit(conn, NewJob(new_id(), "sleep", {"a": 1}, 3))
    assert created
    async with engine.begin() as conn:
        raw = await driver(conn)
        (claimed,) = await compiled.claim(raw, {"default": 5}, 60)
    assert claimed.id == job.id and claimed.attempts == 1 and claimed.lease_token == 1
    async with engine.begin() as conn:
        raw = await driver(conn)
        assert await compiled.record(raw, Operation.COMPLETE, [claimed.lease]) == []
        assert (await store.get(conn, job.id)).status == "completed"
