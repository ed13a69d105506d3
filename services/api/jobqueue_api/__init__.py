"""jobqueue_api: the HTTP service (`jobqueue-api`) that submits, reads and requeues jobs."""
