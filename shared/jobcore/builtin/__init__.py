"""Handlers every installation has: `sleep` and `webhook`. Heavy imports are deferred."""
