from jobcore import store
from jobcore.ids import new_id


async def test_submitted_job_can_be_claimed_and_completed(engine):
    async with engine.begin() as conn:
        job, created = await store.submit(conn, store.NewJob(new_id(), "sleep", {"a": 1}, 3))
    assert created
    async with engine.begin() as conn:
        (claimed,) = await store.claim(conn, 5, 60)
    assert claimed.id == job.id and claimed.attempts == 1 and claimed.lease_token == 1
    async with engine.begin() as conn:
        assert await store.complete(conn, [claimed.lease]) == []
        assert (await store.get(conn, job.id)).status == "completed"
