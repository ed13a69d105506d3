"""jobqueue_api: the HTTP service (`jobqueue-api`) that submits, reads, waits for, lists,
requeues and cancels jobs, and shows each queue's depths."""
