"""Channels to the daemon: Unix socket or TCP, plaintext or TLS, with an optional bearer token."""
import grpc

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
    module = grpc.aio if aio else grpc
    if credentials is not None:
        return module.secure_channel(target, credentials, options=OPTIONS)
    return module.insecure_channel(target, options=OPTIONS)
