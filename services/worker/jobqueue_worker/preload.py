"""Imported by the fork server (`jobqueue_worker.launch`) and nowhere else.

It loads the worker process's modules once for every process forked from it, and
installs the worker process's early SIGTERM handler there. That handler only notes which
process the signal reached, so the fork server itself outlives a SIGTERM sent to the
whole process group (it must stay up to report its children's exits to the supervisor),
while a worker process that gets SIGTERM between its fork and its own start-up still
stops.

What it imported is then frozen out of the garbage collector, as a worker process
freezes what its own start-up made: collections in the worker processes skip it, and
leave its memory shared with the fork server instead of writing to every object.
"""

from __future__ import annotations

import gc
import signal

from jobqueue_worker import child

signal.signal(signal.SIGTERM, child.early_stop)
gc.collect()
gc.freeze()
