"""What the client checks of the daemon's word before it maps or touches memory (DESIGN's rule 7).

A daemon can be wrong (a bug, a forged take-over, another version). Without these checks a
lease whose block runs past its segment, or is smaller than asked, would become a buffer or a
device pointer that PyTorch or CuPy writes past the mapping (SIGSEGV, SIGBUS) or into the next
block. So a lease's or hold's sizes and offset are checked before anything is fetched or mapped
(:func:`check_lease`), and what is about to be mapped is measured against the size the reply
gave it (:func:`check_segment_size`: a descriptor's or a segment file's ``fstat``, a CUDA
allocation's range).

Every failure is a :class:`GpumemdError` coded ``INTERNAL`` (the code of the daemon's own
errors) whose message starts "the daemon's reply is inconsistent" and names the field and its
values. Functions without I/O or state, shared by the sync and asyncio clients.
"""
import grpc

from ._errors import GpumemdError

INCONSISTENT = "the daemon's reply is inconsistent: "


def inconsistent(what):
    """The error for an inconsistency described by ``what``."""
    return GpumemdError(grpc.StatusCode.INTERNAL, INCONSISTENT + what)


def check_lease(response, device=None, size=None):
    """Checks a LeaseResponse: a lease's when ``size`` (and ``device``) say what was asked, a
    hold's when ``size`` is None (a hold asks for no size). It must carry a memory handle,
    ``block_bytes`` must cover ``size_bytes`` (which a lease's must equal the size asked), and
    the block ``[offset, offset + block_bytes)`` must lie in ``[0, segment_bytes)``."""
    what = "%s %s" % ("hold" if size is None else "lease", response.lease_id)
    handle = response.handle
    if not response.HasField("handle") or handle.WhichOneof("kind") is None:
        raise inconsistent("%s carries no memory handle" % what)
    what += " (segment %d)" % handle.segment_id
    size_bytes, block, segment, offset = (response.size_bytes, response.block_bytes, handle.segment_bytes,
                                          handle.offset)
    if size is not None:
        if device is not None and response.device != device:
            raise inconsistent("%s: device %d (expected: %d, the device asked)" % (what, response.device, device))
        if size_bytes != size:
            raise inconsistent("%s: size_bytes %d (expected: %d, the size asked)" % (what, size_bytes, size))
    if size_bytes <= 0:
        raise inconsistent("%s: size_bytes %d (expected: > 0)" % (what, size_bytes))
    if block < size_bytes:
        raise inconsistent("%s: block_bytes %d is smaller than size_bytes %d%s"
                           % (what, block, size_bytes, "" if size is None else ", the size asked"))
    if segment <= 0:
        raise inconsistent("%s: segment_bytes %d (expected: > 0)" % (what, segment))
    if offset < 0:
        raise inconsistent("%s: offset %d (expected: >= 0)" % (what, offset))
    # Python's ints do not overflow, but int64 fields may still say so: compare as the Java
    # client does, with a difference, so that both clients read the same message.
    if block > segment - offset:
        raise inconsistent("%s: offset + block_bytes = %d + %d runs past segment_bytes %d"
                           % (what, offset, block, segment))


def check_segment_size(what, actual, source, expected):
    """Checks that what is about to be mapped (``what``: "the descriptor of segment 3 (fstat)")
    has the size ``source`` ("the fd channel's grant") gave it."""
    if actual != expected:
        raise inconsistent("%s is %d bytes, %s says segment_bytes %d" % (what, actual, source, expected))
