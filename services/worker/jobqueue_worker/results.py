"""A handler's return value as the job's `result`: `jobcore.results`, the encoder the worker
and `jobcore.testing` share, under the name the worker's modules import."""

from jobcore.results import ResultError, decode_result, encode_result

__all__ = ["ResultError", "decode_result", "encode_result"]
