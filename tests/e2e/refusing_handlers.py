"""A JOB_HANDLERS module the supervisor imports and a worker process cannot: each worker
process fails as it starts (tests/e2e/test_worker_liveness.py)."""

import multiprocessing

if multiprocessing.parent_process() is not None:  # a worker process, not the supervisor
    raise RuntimeError("this module cannot be imported in a worker process")
