"""Channels to the daemon: Unix socket or TCP, plaintext or TLS, with an optional bearer token;
unary calls refused while the daemon moves to its successor are called again (:class:`MovingRetry`)."""
import asyncio
import collections
import time

import grpc

MOVING = "gpumemd-moving"  # the trailer a moving daemon sets on the calls it did not serve ("1")
MOVED = "gpumemd-moved"    # set beside it once the successor serves ("1"): the first retry goes at once
MIN_BACKOFF = 0.01  # seconds before the first retry of a call refused while moving, doubling ...
MAX_BACKOFF = 0.1   # ... up to this ...
RETRY_BOUND = 30.0  # ... for at most this long from the first attempt (never past the call's timeout)

# Never route the daemon's traffic through an HTTP proxy from the environment. Reconnect within
# a second of the daemon coming back: gRPC's default backoff grows toward 120 s, which outlasts
# the client's own 10 s window for reopening a session after a daemon restart. (Not
# grpc.min_reconnect_backoff_ms: gRPC also takes it as the connect timeout.)
OPTIONS = (
    ("grpc.enable_http_proxy", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def _pem(value, name):
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        with open(value, "rb") as f:
            return f.read()
    raise TypeError("%s: %r (expected: PEM bytes or a file path)" % (name, value))


def options(root_certificates=None, private_key=None, certificate_chain=None, token=None):
    """(credentials or None, metadata tuple) for a target."""
    credentials = None
    if root_certificates is not None or certificate_chain is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_pem(root_certificates, "root_certificates"),
            private_key=_pem(private_key, "private_key"),
            certificate_chain=_pem(certificate_chain, "certificate_chain"))
    metadata = (("authorization", "Bearer " + token),) if token else ()
    return credentials, metadata


def open_channel(target, credentials, aio=False):
    """A channel to ``unix:///path/to.sock`` or ``host:port`` (TLS when credentials are given)."""
    if credentials is not None and target.startswith("unix:"):
        raise ValueError("target: %r (expected: host:port with TLS; a Unix socket is local and "
                         "identifies its peer by SO_PEERCRED)" % target)
    if aio:
        if credentials is not None:
            return grpc.aio.secure_channel(target, credentials, options=OPTIONS, interceptors=[AsyncMovingRetry()])
        return grpc.aio.insecure_channel(target, options=OPTIONS, interceptors=[AsyncMovingRetry()])
    if credentials is not None:
        channel = grpc.secure_channel(target, credentials, options=OPTIONS)
    else:
        channel = grpc.insecure_channel(target, options=OPTIONS)
    return grpc.intercept_channel(channel, MovingRetry())


def is_moving(code, trailers):
    """Whether a call that ended with ``code`` and ``trailers`` (metadata pairs) was refused
    because the daemon is handing over to its successor (gpumemd --take-over): UNAVAILABLE with
    ``gpumemd-moving: 1``; the call was not served. A draining daemon's UNAVAILABLE is not."""
    return code == grpc.StatusCode.UNAVAILABLE and any(
        key == MOVING and value == "1" for key, value in (trailers or ()))


def backoff(n):
    """Seconds before retry ``n`` (1 for the first): 10 ms doubling to 100 ms (a hand-over refuses calls
    for about a tenth of a second)."""
    return min(MAX_BACKOFF, MIN_BACKOFF * 2 ** min(n - 1, 10))


def wait_before(trailers, n):
    """Seconds before retry ``n`` of a call refused with ``trailers``: none for the first when
    the successor serves already (``gpumemd-moved: 1``: the call waited for the hand-over's end
    at the old daemon), else :func:`backoff`. Only the first: a channel still on the old
    daemon's connection would be refused again at once, and spin."""
    if n == 1 and any(key == MOVED and value == "1" for key, value in (trailers or ())):
        return 0.0
    return backoff(n)


def retries(code, trailers, n, elapsed):
    """Whether to call again, after ``n`` retries and ``elapsed`` seconds since the first attempt."""
    return is_moving(code, trailers) and elapsed + backoff(n + 1) <= RETRY_BOUND


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


def _with_timeout(details, timeout):
    return _Details(details.method, timeout, details.metadata, details.credentials,
                    getattr(details, "wait_for_ready", None), getattr(details, "compression", None))


class _Attempts:
    """The attempts of one unary call, without I/O: whether the last outcome goes to the caller or
    the call is made again, after how long, and with what is left of the call's timeout (which
    covers every attempt). :class:`MovingRetry` and :class:`AsyncMovingRetry` only call and wait.
    One per call; not thread-safe."""

    __slots__ = ("details", "_start", "_timeout", "_n")

    def __init__(self, details):
        self.details = details  # the next attempt's
        self._start = time.monotonic()
        self._timeout = details.timeout
        self._n = 0

    def next_wait(self, code, trailers):
        """Seconds to wait before calling again with :attr:`details`, or None: the outcome that
        ended with ``code`` and ``trailers`` goes to the caller."""
        elapsed = time.monotonic() - self._start
        if not retries(code, trailers, self._n, elapsed):
            return None
        self._n += 1
        wait = wait_before(trailers, self._n)
        if self._timeout is not None:
            left = self._timeout - elapsed - wait
            if left <= 0:
                return None
            self.details = _with_timeout(self.details, left)
        return wait


class MovingRetry(grpc.UnaryUnaryClientInterceptor):
    """Calls a unary method again, with backoff (:func:`backoff`, :data:`RETRY_BOUND`), while
    the daemon answers that it is moving (:func:`is_moving`); any other answer, or the last
    one past the bound or the call's timeout, goes to the caller. Every unary call of a
    client's channel passes here (one place for all of them); streams do not (the KeepAlive
    stream reattaches itself). Stateless: thread-safe."""

    def intercept_unary_unary(self, continuation, details, request):
        attempts = _Attempts(details)
        while True:
            outcome = continuation(attempts.details, request)
            wait = attempts.next_wait(outcome.code(), outcome.trailing_metadata())
            if wait is None:
                return outcome
            if wait:
                time.sleep(wait)


class AsyncMovingRetry(grpc.aio.UnaryUnaryClientInterceptor):
    """:class:`MovingRetry` for the asyncio client's channel."""

    async def intercept_unary_unary(self, continuation, details, request):
        attempts = _Attempts(details)
        while True:
            call = await continuation(attempts.details, request)
            wait = attempts.next_wait(await call.code(), await call.trailing_metadata())
            if wait is None:
                return call
            if wait:
                await asyncio.sleep(wait)
