"""The one exception type of the package, and the conversions to it."""
import grpc

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class GpumemdError(Exception):
    """A call to gpumemd failed, or the client refused an operation.

    ``code`` is a :class:`grpc.StatusCode` (the daemon's status, e.g. ``INVALID_ARGUMENT`` for a
    size of 0, ``RESOURCE_EXHAUSTED`` when the pool is full, ``UNAVAILABLE`` while it drains);
    ``message`` is the daemon's own words (or the client's, for local errors such as a lease
    used after close, ``FAILED_PRECONDITION``).
    """

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code.name, message))
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, error):
        """From a :class:`grpc.RpcError` (sync or grpc.aio)."""
        code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
        details = error.details() if callable(getattr(error, "details", None)) else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")

    @classmethod
    def from_stream(cls, stream_error):
        """From a StreamError of the KeepAlive stream (a google.rpc.Code number and a message)."""
        return cls(_CODES.get(stream_error.code, grpc.StatusCode.UNKNOWN), stream_error.message)


def closed_lease(lease_id):
    return GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "lease %s is closed" % lease_id)
