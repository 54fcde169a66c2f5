"""Sharing one leased block between processes (issue 16), for both clients.

A block can be held by several sessions of one tenant: the lease's own session, sessions that
attached to it with a share token (:meth:`Client.attach`) or looked up a published name
(:meth:`Client.lookup`), and the valid tokens and published names themselves. Each hold is
released on its own; the daemon returns the block to the pool once the last one is gone.

This module holds what the sync and asyncio clients have in common: request building, the
hold as a lease, and the :class:`Share` / :class:`Published` handles (their ``Async`` twins
differ only in awaiting).
"""
import math

import grpc

from ._errors import GpumemdError
from ._replies import check_lease
from ._stubs import pb

_MAX_UINT32 = (1 << 32) - 1


def share_request(session_id, lease, expires_after, read_only, max_attaches):
    """A ShareRequest; ``expires_after`` None = the daemon's default (300 s)."""
    if expires_after is None:
        seconds = 0
    elif expires_after <= 0:
        raise ValueError("expires_after: %r (expected: seconds > 0, or None for the daemon's default)"
                         % (expires_after,))
    else:
        seconds = min(_MAX_UINT32, math.ceil(expires_after))
    if max_attaches < 0:
        raise ValueError("max_attaches: %r (expected: 0 for any number, or more)" % (max_attaches,))
    return pb.ShareRequest(session_id=session_id, lease_id=lease.id, expires_after_seconds=seconds,
                           read_only=bool(read_only), max_attaches=max_attaches)


def is_not_found(error):
    return isinstance(error, GpumemdError) and error.code == grpc.StatusCode.NOT_FOUND


def closed_client():
    return GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "the gpumemd client is closed")


def publish_request(client, lease, name, read_only):
    """A PublishRequest for a lease or hold of ``client`` that is still open."""
    if getattr(lease, "_client", None) is not client:
        raise ValueError("publish: %r is not a lease of this client" % (lease,))
    lease._require_open()
    lease._shared = True  # the name holds the block: its close must release, not cache it
    return pb.PublishRequest(session_id=lease._session.id, lease_id=lease.id, name=name,
                             read_only=bool(read_only or lease.read_only))


def make_hold(client, s, response, tag, lease_class, give_back, descriptor=None):
    """The Lease for an AttachResponse: the block mapped in this process (read-only for a
    read-only hold on the host backend), once its reply is checked (:mod:`gpumemd._replies`).
    ``give_back()`` releases the hold when it is inconsistent or cannot be mapped here, so that
    it is not held until the session ends. ``descriptor``: its segment's, fetched beforehand
    (the asyncio client)."""
    granted = response.lease
    try:
        check_lease(granted)  # a hold asks for no size: its block must lie in its segment
        mapping = s.mappings.acquire(granted.device, granted.handle, response.read_only, descriptor=descriptor,
                                     tag=tag)
    except BaseException:
        if descriptor is not None:
            descriptor.close()  # acquire closes it, but the check may have refused before it
        give_back(granted.lease_id)
        raise
    client._holds += 1
    return lease_class(client, granted, mapping, tag, session=s, read_only=response.read_only, attached=True)


class _ShareBase:
    """A share token made by ``lease.share()``.

    ``token`` is the credential another process of the same tenant passes to
    ``attach(token)``: treat it like a password (``repr`` shows only its first 8 characters).
    ``expires_after_seconds`` is what the daemon granted. The token holds the block while it is
    valid (not expired, revoked or used up), even after the lease is closed and its process
    has exited; :meth:`revoke` ends that hold (holds already taken with it stay).
    """

    def __init__(self, client, response, lease_id, read_only, max_attaches):
        self._client = client
        self.token = response.token
        self.expires_after_seconds = response.expires_after_seconds
        self.lease_id = lease_id
        self.read_only = read_only
        self.max_attaches = max_attaches
        self.revoked = False

    def _take(self):
        """True once: the first revoke goes to the daemon, later ones do nothing."""
        if self.revoked:
            return False
        self.revoked = True
        return True

    def __repr__(self):
        return "Share(%s…, lease %s, %d s%s%s%s)" % (
            self.token[:8], self.lease_id, self.expires_after_seconds, ", read-only" if self.read_only else "",
            ", one-shot" if self.max_attaches == 1 else ", %d attaches" % self.max_attaches if self.max_attaches else "",
            ", revoked" if self.revoked else "")


class Share(_ShareBase):
    __doc__ = _ShareBase.__doc__ + """
    A context manager: the ``with`` block's end revokes the token. Do not use ``with`` when
    the consumer should attach after you leave the block (a producer that shares and exits):
    keep the Share and let the token expire, be used up (``max_attaches=1``), or be revoked.
    """

    def revoke(self):
        """Revokes the token; True when that was the block's last hold (it went back to the
        pool). A token already gone (expired, used up, revoked) answers False, as does a second
        call."""
        if not self._take():
            return False
        return self._client._revoke_share(self.token, quiet=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.revoke()


class AsyncShare(_ShareBase):
    __doc__ = _ShareBase.__doc__ + """
    ``await share.revoke()``; ``async with`` revokes at the block's end (see :class:`Share`).
    """

    async def revoke(self):
        """As :meth:`Share.revoke`."""
        if not self._take():
            return False
        return await self._client._revoke_share(self.token, quiet=True)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.revoke()


class _PublishedBase:
    """An object published with ``client.publish(lease, name)``.

    The name holds the block until it is unpublished (by any session of the tenant, or by an
    operator), even after the publishing process has exited; ``lookup(name)`` gives other
    processes of the tenant holds on it (read-only ones when ``read_only``).
    """

    def __init__(self, client, name, lease_id, read_only):
        self._client = client
        self.name = name
        self.lease_id = lease_id
        self.read_only = read_only
        self.unpublished = False

    def _take(self):
        if self.unpublished:
            return False
        self.unpublished = True
        return True

    def __repr__(self):
        return "Published(%r, lease %s%s%s)" % (self.name, self.lease_id, ", read-only" if self.read_only else "",
                                               ", unpublished" if self.unpublished else "")


class Published(_PublishedBase):
    __doc__ = _PublishedBase.__doc__ + """
    A context manager: the ``with`` block's end unpublishes the name.
    """

    def unpublish(self):
        """Removes the name; True when it was the block's last hold (it went back to the pool).
        A name already gone answers False, as does a second call. Names are not versioned: if
        someone else unpublished this name and published another object under it, this removes
        theirs."""
        if not self._take():
            return False
        return self._client._unpublish(self.name, quiet=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unpublish()


class AsyncPublished(_PublishedBase):
    __doc__ = _PublishedBase.__doc__ + """
    ``await published.unpublish()``; ``async with`` unpublishes at the block's end.
    """

    async def unpublish(self):
        """As :meth:`Published.unpublish`."""
        if not self._take():
            return False
        return await self._client._unpublish(self.name, quiet=True)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.unpublish()
