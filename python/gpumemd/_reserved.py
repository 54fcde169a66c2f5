"""Address ranges held for shared-memory segments, so that the memory under a range can go and
come back at the same address (what sleep and wake are built on).

A range is first reserved as an inaccessible anonymous mapping (``PROT_NONE``,
``MAP_NORESERVE``: no memory, no commit charge); a segment is then mapped over it (``MAP_FIXED |
MAP_SHARED``); :func:`vacate` puts the inaccessible mapping back over the segment and :func:`fill`
maps a segment again. The range is never left unmapped until :func:`release`: a ``munmap`` would
open a hole that another thread's ``mmap`` could take, and a later ``MAP_FIXED`` would then
silently replace that thread's memory. Linux only; the calls go through ctypes to libc.

Stateless and thread-safe; the caller serializes the calls on one range.
"""
import ctypes
import os

PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
_INACCESSIBLE = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _call(address, length, prot, flags, fd, what):
    result = _mmap(address, length, prot, flags, fd, 0)
    if result is None or result == _MAP_FAILED:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))
    if address is not None and result != address:  # MAP_FIXED maps there or fails
        raise OSError(0, "%s: mmap MAP_FIXED returned %#x, not %#x" % (what, result, address))
    return result


def reserve(length):
    """Reserves ``length`` bytes of address space, inaccessible, anywhere; its address."""
    if length <= 0:
        raise ValueError("length %d" % length)
    return _call(None, length, PROT_NONE, _INACCESSIBLE, -1, "mmap of a %d-byte reservation" % length)


def fill(address, length, fd, read_only):
    """Maps the first ``length`` bytes of the file behind ``fd`` over the range, ``MAP_SHARED``,
    replacing what was there in one step (the caller checks the file's size first: touching a
    mapping past its file's end is SIGBUS, and keeps ``fd``). On a failure the range is as it was."""
    prot = PROT_READ if read_only else PROT_READ | PROT_WRITE
    _call(address, length, prot, MAP_SHARED | MAP_FIXED, fd, "mmap MAP_FIXED of a segment")


def vacate(address, length):
    """Puts the inaccessible reservation back over the range: the segment is unmapped, touching
    the range faults, and the address stays the range's."""
    _call(address, length, PROT_NONE, _INACCESSIBLE | MAP_FIXED, -1, "mmap MAP_FIXED of the reservation")


def release(address, length):
    """Unmaps the whole range, segment or reservation (a finalizer's action: never raises)."""
    _munmap(address, length)
