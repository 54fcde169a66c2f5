"""This process's segment mappings: one per segment id, shared by every lease on it.

A host segment is its shared-memory file mapped whole (a lease is a slice of it) into an
address range of its own (:mod:`gpumemd._reserved`): the range reserved inaccessible, the segment
mapped over it with ``MAP_FIXED``, views made from the address (``ctypes`` ``from_address``).
:meth:`HostMapping.vacate` lets the segment go and keeps the range, :meth:`HostMapping.refill`
maps a segment of the same size there again: every memoryview and array made from it keeps its
address through both (what sleep and wake are built on; touching it while vacated faults); a legacy CUDA segment is opened once with ``cuIpcOpenMemHandle`` (CUDA allows one open per
context); a CUDA VMM segment (``cuda_vmm``) is a descriptor from the fd channel, imported,
mapped into an address range of its own and made accessible once. A mapping outlives its last
lease, since the next lease is likely to land on the same segment; it is closed when the daemon
asks (``UnmapSegment``: it wants to free the segment) and no live lease uses it, or when the
client closes or its session is lost.

A host mapping cannot be closed while Python objects still export its memory (a numpy array
made from a closed lease's buffer, say): every view is made from one ctypes object, whose
reference count says whether views are alive, and closing refuses while any is (as
``mmap.close`` refuses while the mmap object exports buffers), so nothing can touch unmapped
memory. Such a mapping waits, unacknowledged, and is tried again on the client's next
operations; the daemon frees the segment only after the acknowledgement. A CUDA mapping is
closed after a synchronize of its context (work still queued on the memory completes first);
a CUDA call that fails while closing is logged, the other mappings are closed all the same and
the unmap is acknowledged (the driver's state after a failed unmap is not ours to repair, and
the daemon must not wait forever for a segment).

Read-only holds (a share or a published name made read-only) get a mapping of their own on the
host backend and on CUDA VMM: the segment's descriptor opened ``O_RDONLY`` and mapped
``PROT_READ`` on the host, or the VMM allocation mapped again with read-only access
(``cuMemSetAccess`` PROT_READ), so that writes through their memory fail. A segment may then
have two mappings in this process, the writable one (for its leases and writable holds) and the
read-only one; a read-only hold is never handed the writable one. Both are closed before the
unmap is acknowledged. With legacy CUDA IPC handles read-only is advisory (a legacy handle
cannot be opened read-only, and CUDA allows one open per context), so every lease and hold on a
segment shares its one mapping.

A sleep (:mod:`gpumemd._sleep`) sets the segments it covers aside: out of the table, their
mappings vacated, still counted by their leases (a sleeping lease may close) and closed with the
rest, and no hold is mapped on them; the wake puts each back under the id of the segment it
became (a mapping knows its ``segment_id``, and a lease reads its own from its mapping), a
refused sleep under its own. An ``UnmapSegment`` of a set-aside segment is acknowledged at
once: the sleep's vacated segments told the daemon already.

CUDA mappings live on this process's ordinal of the daemon's device, found by UUID (the
daemon's devices come with OpenSession); a lease on a GPU this process cannot see fails with
FAILED_PRECONDITION naming its UUID.

Thread-safe: the table is guarded by one lock; mappings are closed and acknowledged outside it
(except retries of waiting mappings, closed under it so that acquire cannot take one back
half-closed).
"""
import ctypes
import functools
import logging
import os
import sys
import threading
import weakref

import grpc

from . import _cuda, _reserved
from ._errors import GpumemdError
from ._replies import check_segment_size, inconsistent

log = logging.getLogger("gpumemd")

_DESCRIPTOR_KINDS = ("fd_segment", "cuda_vmm")
_READ_ONLY_KINDS = ("host_shm_path", "fd_segment", "cuda_vmm")  # with a read-only mapping of their own


class HostMapping:
    """A host segment mapped whole: its file opened by path, or a descriptor the fd channel
    gave (:meth:`from_descriptor`), mapped into an address range of its own (see the module
    notes): :meth:`vacate` and :meth:`refill` keep ``address`` and every view made from it. Not
    locked: whoever vacates and refills serializes those calls with each other and with closing."""

    kind = "host"

    def __init__(self, device, path, segment_bytes, read_only=False, fd=None, source="the lease's reply",
                 segment_id=None):
        self.device = device
        #: The segment mapped here now (a wake moves the mapping to another, see gpumemd._sleep).
        self.segment_id = segment_id
        self.path = path
        self.read_only = read_only
        self.segment_bytes = segment_bytes
        self.vacated = False
        self._closed = False
        what = "host segment file %s" % path
        if fd is None:
            fd = _open(path, read_only)
        else:
            what = "the descriptor of %s (fstat)" % path
        try:
            # Before mapping: touching a mapping past its file's end is SIGBUS: the file must be
            # the segment the daemon described.
            check_segment_size(what, os.fstat(fd).st_size, source, segment_bytes)
            self.address = _reserved.reserve(segment_bytes)
            try:
                _reserved.fill(self.address, segment_bytes, fd, read_only)
            except BaseException:
                _reserved.release(self.address, segment_bytes)
                raise
        except (OSError, ValueError) as e:
            raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "cannot map host segment %s: %s" % (path, e))
        finally:
            os.close(fd)  # the mapping does not need it
        # The one object every view exports: its reference count says whether views are alive
        # (each memoryview made from it holds it once, however many slices are made of that
        # view), and its finalizer unmaps the range once it is gone, as an mmap object would.
        self._array = _segment_type(segment_bytes).from_address(self.address)
        self._unmap = weakref.finalize(self._array, _reserved.release, self.address, segment_bytes)
        self._unmap.atexit = False  # at exit, other threads may still touch it: the process's end unmaps it
        self._unexported = sys.getrefcount(self._array)

    @classmethod
    def from_descriptor(cls, device, segment_id, fd, segment_bytes, read_only):
        """Maps a descriptor from the fd channel, and closes it (also when mapping fails)."""
        return cls(device, "segment %d" % segment_id, segment_bytes, read_only, fd=fd,
                   source="the fd channel's grant", segment_id=segment_id)

    @property
    def closed(self):
        return self._closed

    def view(self, offset, size):
        """A memoryview of the block; read-only (``view.readonly``) on a read-only mapping. Made
        also while vacated (touching it then faults)."""
        if self._closed:
            raise ValueError("segment mapping is closed")
        view = memoryview(self._array).cast("B")[offset:offset + size]
        return view.toreadonly() if self.read_only else view

    def exported(self):
        """True while views (memoryviews, numpy arrays) made from the mapping are alive."""
        return not self._closed and sys.getrefcount(self._array) > self._unexported

    def vacate(self):
        """Lets the segment go and keeps the range, inaccessible: views keep their address for
        :meth:`refill`; touching them meanwhile faults (SIGSEGV). Nothing when vacated."""
        self._check_open()
        if not self.vacated:
            _reserved.vacate(self.address, self.segment_bytes)
            self.vacated = True

    def refill(self, path=None, fd=None):
        """Maps a segment of the same size over the range, with this mapping's access: the file
        at ``path``, or the descriptor ``fd`` (the caller's to close). Every view made before
        sees its bytes at the same address. On a failure the range is as it was."""
        self._check_open()
        if (path is None) == (fd is None):
            raise ValueError("refill: give path or fd")
        what = "host segment file %s" % path if fd is None else "descriptor %d (fstat)" % fd
        own = _open(path, self.read_only) if fd is None else fd
        try:
            check_segment_size(what, os.fstat(own).st_size, "the mapping it refills", self.segment_bytes)
            _reserved.fill(self.address, self.segment_bytes, own, self.read_only)
        except OSError as e:
            raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "cannot map %s: %s" % (what, e))
        finally:
            if fd is None:
                os.close(own)
        self.vacated = False

    def _check_open(self):
        if self._closed:
            raise ValueError("segment mapping is closed")

    def try_close(self):
        """Unmaps the range; False while exported buffers (memoryviews, numpy arrays) still use it."""
        if self._closed:
            return True
        if self.exported():
            return False
        self._closed = True
        self._unmap()
        return True


@functools.lru_cache(maxsize=64)
def _segment_type(size):
    """A ctypes array type of ``size`` bytes that takes weak references (for the finalizer; a
    plain ctypes array does not). Made once per segment size: a class made per mapping costs a
    class creation and, since a class is a reference cycle, a garbage collection later."""
    return type("_Segment", (ctypes.c_char * size,), {})


def _open(path, read_only):
    try:
        return os.open(path, (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC)
    except OSError as e:
        raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "cannot open host segment %s: %s" % (path, e))


class CudaMapping:
    """A legacy CUDA segment opened with ``cuIpcOpenMemHandle`` on this process's ``device``.
    It cannot sleep: the driver places an IPC mapping where it likes, not at a kept address."""

    kind = "cuda"
    read_only = False  # one mapping per segment and context: read-only is advisory with legacy handles
    vacated = False

    def __init__(self, device, segment_id, handle_bytes, segment_bytes):
        self.device = device
        self.segment_id = segment_id
        self.segment_bytes = segment_bytes
        self.base = _cuda.open_mem_handle(device, handle_bytes)
        try:
            # The allocation opened must start here and cover segment_bytes, within which the
            # lease was checked to lie: a device pointer beyond it reaches someone else's memory.
            start, size = _cuda.address_range(device, self.base)
            if start != self.base or size < segment_bytes:
                raise inconsistent("the CUDA allocation of segment %d opened from its IPC handle is %d bytes at %#x "
                                   "(its range starts at %#x), the lease's reply says segment_bytes %d"
                                   % (segment_id, size, self.base, start, segment_bytes))
        except BaseException:
            _log_failures(self, _cuda.close_mem_handle(device, self.base))
            raise
        self._closed = False

    def try_close(self):
        """Synchronizes, closes the handle; True (a failure is logged: see the module notes)."""
        if not self._closed:
            self._closed = True
            _log_failures(self, _cuda.close_mem_handle(self.device, self.base))
        return True


class VmmMapping:
    """A CUDA VMM segment (``cuda_vmm``): the descriptor imported, ``segment_bytes`` of address
    space reserved and mapped on this process's ``device``, with read-write or read-only access.
    The range is kept from mapping to close: :meth:`vacate` unmaps and releases the allocation
    (the range stays reserved), :meth:`refill` maps a newly imported allocation of the same size
    at ``base`` again, so every device pointer and tensor made from it keeps its address."""

    kind = "cuda"

    def __init__(self, device, segment_id, fd, segment_bytes, read_only):
        """Closes ``fd`` (also when mapping fails): the imported handle holds the allocation."""
        self.device = device
        self.segment_id = segment_id
        self.segment_bytes = segment_bytes
        self.read_only = read_only
        try:
            self.base, self._handle = _cuda.import_and_map(device, fd, segment_bytes, read_only, segment_id)
        finally:
            os.close(fd)
        self._closed = False

    @property
    def vacated(self):
        return self._handle is None

    @property
    def closed(self):
        return self._closed

    def vacate(self):
        """Waits for the context's queued work, unmaps and releases the allocation, keeps the
        range (a kernel touching it meanwhile faults). Nothing when vacated."""
        if self._closed:
            raise ValueError("segment mapping is closed")
        if self._handle is not None:
            handle = self._handle
            failed = _cuda.vacate(self.device, self.base, handle, self.segment_bytes)  # raises before unmapping
            self._handle = None
            if failed:
                log.warning("gpumemd: vacating the mapping of segment %d on CUDA device %d: %s; the range is "
                            "vacated all the same", self.segment_id, self.device, "; ".join(failed))

    def refill(self, fd):
        """Imports ``fd`` (the caller's to close) and maps it at ``base`` with this mapping's
        access: the same allocation or another of the same size. On a failure it stays vacated."""
        if self._closed:
            raise ValueError("segment mapping is closed")
        if self._handle is not None:
            raise ValueError("the CUDA VMM mapping at %#x is not vacated: the driver maps only into an "
                             "unmapped range" % self.base)
        self._handle = _cuda.refill(self.device, self.base, fd, self.segment_bytes, self.read_only, self.segment_id)

    def try_close(self):
        """Synchronizes, unmaps, frees the range, releases the handle; True (a failure is
        logged: see the module notes)."""
        if not self._closed:
            self._closed = True
            _log_failures(self, _cuda.unmap(self.device, self.base, self._handle, self.segment_bytes))
        return True


def _log_failures(mapping, failed):
    if failed:
        log.warning("gpumemd: closing the mapping of segment %d on CUDA device %d failed (%s); "
                    "acknowledged all the same", mapping.segment_id, mapping.device, "; ".join(failed))


def _close_quietly(mapping):
    """try_close, with anything it raises logged: one mapping's failure never keeps the others
    open or the acknowledgement unsent. True when it is closed (or cannot be closed by trying
    again)."""
    try:
        return mapping.try_close()
    except Exception as e:  # noqa: BLE001 (a driver or OS failure: logged, not fatal to the others)
        log.warning("gpumemd: closing a mapping of segment %s failed: %s", getattr(mapping, "segment_id", "?"), e)
        return True


class _Entry:
    __slots__ = ("mappings", "leases", "unmap_requested", "segment_bytes", "handle", "tags")

    def __init__(self, mappings=None, segment_bytes=None, handle=None):
        self.mappings = mappings or {}  # read_only (bool) -> mapping
        self.leases = 0
        self.unmap_requested = False
        # The segment_bytes its mappings were checked against (None: unknown, a test's entry): a
        # later reply on the segment must say the same (a segment never changes size), since its
        # offsets are checked against it.
        self.segment_bytes = segment_bytes
        # The segment's MemoryHandle (a refused sleep maps it again from there), and the tags of
        # the leases and holds granted on it, never removed: a sleep with tags vacates a superset
        # of the segments the daemon puts to sleep, which is what it asks for.
        self.handle = handle
        self.tags = set()


class MappingCache:
    def __init__(self, ack_unmapped, fetch_descriptor=None, device_uuid=None):
        """``ack_unmapped(segment_id)`` is called once a requested unmap is done;
        ``fetch_descriptor(handle, read_only)`` gives a :class:`gpumemd._fdchannel.Descriptor`
        for a segment passed by descriptor (``fd_segment`` and ``cuda_vmm`` handles), blocking;
        ``device_uuid(device)`` the UUID of a daemon device ("" when unknown)."""
        self._ack = ack_unmapped
        self._fetch = fetch_descriptor
        self._device_uuid = device_uuid or (lambda device: "")
        self._lock = threading.Lock()
        self._entries = {}
        self._waiting = {}  # segment id -> ([mappings], ack): closed by us, refused while exported for now
        self._asleep = {}   # segment id -> _Entry: set aside by a sleep (gpumemd._sleep), vacated
        self.maps_opened = 0

    def needs_descriptor(self, handle, read_only=False):
        """True when :meth:`acquire` would fetch a descriptor for this handle (a segment passed
        by descriptor, not mapped here yet): the asyncio client fetches it first, off its loop."""
        if handle.WhichOneof("kind") not in _DESCRIPTOR_KINDS:
            return False
        with self._lock:
            entry = self._entries.get(handle.segment_id)
            waiting = self._waiting.get(handle.segment_id)
            mapped = (entry is not None and bool(read_only) in entry.mappings) or (
                waiting is not None and any(m.read_only == bool(read_only) for m in waiting[0]))
            return not mapped

    def acquire(self, device, handle, read_only=False, descriptor=None, tag=""):
        """The mapping of a lease's or hold's segment (a MemoryHandle), opened on first use;
        counts the lease, and its ``tag`` (for a sleep with tags). ``read_only``: the segment's
        read-only mapping (host backend; on CUDA its one mapping). ``descriptor``: a
        :class:`gpumemd._fdchannel.Descriptor` fetched beforehand for an ``fd_segment`` handle
        (see :meth:`needs_descriptor`); closed here if not needed."""
        segment_id = handle.segment_id
        kind = handle.WhichOneof("kind")
        key = bool(read_only) and kind in _READ_ONLY_KINDS
        try:
            return self._acquire(device, handle, segment_id, kind, key, descriptor, tag)
        finally:
            if descriptor is not None:
                descriptor.close()

    def _acquire(self, device, handle, segment_id, kind, key, descriptor, tag):
        with self._lock:
            if self._asleep and segment_id in self._asleep:
                # Its range here is vacated until the wake: a hold must not be handed that.
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "segment %d sleeps in this process (the session sleeps): wake it first" % segment_id)
            entry = self._entries.get(segment_id)
            waiting = None
            if entry is None:
                waiting = self._waiting.get(segment_id)
                mapped = getattr(waiting[0][0], "segment_bytes", None) if waiting else None
            else:
                mapped = entry.segment_bytes
            if mapped is not None and mapped != handle.segment_bytes:
                raise inconsistent("segment %d is mapped here with segment_bytes %d, this reply says %d"
                                   % (segment_id, mapped, handle.segment_bytes))
            if entry is None:
                waiting = self._waiting.pop(segment_id, None)
                # never unmapped, still valid: take them back
                entry = _Entry({m.read_only: m for m in waiting[0]} if waiting else None, handle.segment_bytes,
                               handle)
            mapping = entry.mappings.get(key)
            if mapping is None:
                try:
                    if kind == "host_shm_path":
                        mapping = HostMapping(device, handle.host_shm_path, handle.segment_bytes, key,
                                              segment_id=segment_id)
                    elif kind in _DESCRIPTOR_KINDS:
                        mapping = self._map_descriptor(device, handle, kind, key, descriptor)
                    elif kind == "cuda_ipc_handle":
                        mapping = CudaMapping(self._cuda_device(device), segment_id, handle.cuda_ipc_handle,
                                              handle.segment_bytes)
                    else:
                        raise GpumemdError(grpc.StatusCode.INTERNAL, "lease response carries no memory handle")
                except BaseException:
                    if waiting is not None:
                        self._waiting[segment_id] = waiting  # as it was
                    raise
                entry.mappings[key] = mapping
                self.maps_opened += 1
            self._entries[segment_id] = entry
            entry.leases += 1
            entry.tags.add(tag)
            return mapping

    def _cuda_device(self, device):
        """This process's ordinal of the daemon's CUDA ``device``, by its UUID."""
        return _cuda.local_device(device, self._device_uuid(device))

    def _map_descriptor(self, device, handle, kind, read_only, descriptor):
        """Maps a segment passed by descriptor: the one fetched beforehand, else one fetched now
        (under the lock, so that a segment is fetched once however many threads lease on it)."""
        local = self._cuda_device(device) if kind == "cuda_vmm" else None  # before a descriptor is fetched
        if descriptor is None:
            if self._fetch is None:
                raise GpumemdError(grpc.StatusCode.INTERNAL, "no fd channel for a segment passed by descriptor")
            descriptor = self._fetch(handle, read_only)
        grant = descriptor.grant
        fd = descriptor.take()  # ours now: mapping closes it, also when it fails
        if grant.segment_bytes != handle.segment_bytes:
            os.close(fd)
            raise inconsistent("segment %d: the fd channel's grant says segment_bytes %d, the lease's reply %d"
                               % (handle.segment_id, grant.segment_bytes, handle.segment_bytes))
        if grant.read_only != read_only:
            os.close(fd)
            raise GpumemdError(grpc.StatusCode.INTERNAL, "fd channel: segment %d granted %s, asked %s"
                               % (handle.segment_id, "read-only" if grant.read_only else "writable",
                                  "read-only" if read_only else "writable"))
        if kind == "cuda_vmm":
            # A VMM descriptor has no file size to fstat: cuMemMap of segment_bytes checks the allocation.
            return VmmMapping(local, handle.segment_id, fd, handle.segment_bytes, read_only)
        return HostMapping.from_descriptor(device, handle.segment_id, fd, handle.segment_bytes, read_only)

    def release(self, segment_id):
        """A lease or hold on the segment closed (a sleeping one too)."""
        to_close = None
        with self._lock:
            entry = self._entries.get(segment_id)
            if entry is None and self._asleep:
                entry = self._asleep.get(segment_id)  # counted, kept until the wake says what it became
            if entry is not None:
                entry.leases -= 1
                if entry.leases == 0 and entry.unmap_requested:
                    del self._entries[segment_id]
                    to_close = entry
        if to_close is not None:
            self._close(segment_id, list(to_close.mappings.values()), True)
        if self._waiting:
            self.retry()

    def unmap_requested(self, segment_id):
        """The daemon asks to unmap a segment: now if no lease uses it, else when the last closes."""
        with self._lock:
            entry = self._entries.get(segment_id)
            if entry is not None and entry.leases > 0:
                entry.unmap_requested = True
                return
            if entry is not None:
                del self._entries[segment_id]
        if entry is None:
            self._ack(segment_id)  # never mapped here, or already closed
        else:
            self._close(segment_id, list(entry.mappings.values()), True)

    def _close(self, segment_id, mappings, ack):
        remaining = [m for m in mappings if not _close_quietly(m)]
        if not remaining:
            if ack:
                self._ack(segment_id)
        else:
            with self._lock:
                self._waiting[segment_id] = (remaining, ack)

    def retry(self):
        """Closes the mappings that exported buffers held open, if they are gone now."""
        done = []
        with self._lock:  # under the lock, so that acquire() cannot take back a half-closed one
            for segment_id, (mappings, ack) in list(self._waiting.items()):
                remaining = [m for m in mappings if not _close_quietly(m)]
                if remaining:
                    self._waiting[segment_id] = (remaining, ack)
                else:
                    del self._waiting[segment_id]
                    if ack:
                        done.append(segment_id)
        for segment_id in done:
            self._ack(segment_id)

    def __len__(self):
        with self._lock:
            return len(self._entries)

    def cuda_devices(self):
        """This process's CUDA devices that the mappings live on (sorted): their contexts hold
        the work that may still use the mapped memory."""
        with self._lock:
            mappings = [m for e in self._entries.values() for m in e.mappings.values()]
            mappings += [m for ms, _ in self._waiting.values() for m in ms]
        return sorted({m.device for m in mappings if m.kind == "cuda"})

    def close_all(self):
        """Closes every mapping (the client closes), sleeping ones too. Host mappings still
        exported stay mapped until the last exporting object is gone (the mapping's finalizer
        then unmaps it)."""
        with self._lock:
            mappings = [m for e in self._entries.values() for m in e.mappings.values()]
            mappings += [m for e in self._asleep.values() for m in e.mappings.values()]
            mappings += [m for ms, _ in self._waiting.values() for m in ms]
            self._entries.clear()
            self._asleep.clear()
            self._waiting.clear()
        for mapping in mappings:
            _close_quietly(mapping)

    # ------------------------------------------------------------------ sleep and wake (gpumemd._sleep)

    def fetch_descriptor(self, handle, read_only):
        """A :class:`gpumemd._fdchannel.Descriptor` of the handle's segment (blocking)."""
        if self._fetch is None:
            raise GpumemdError(grpc.StatusCode.INTERNAL, "no fd channel for a segment passed by descriptor")
        return self._fetch(handle, read_only)

    def set_aside(self, tags):
        """Takes the segments a sleep covers out of the table: each with a lease or hold here,
        and with one of ``tags`` when given (a set; see :class:`_Entry`). ``[(segment_id,
        entry)]``, whose mappings the caller vacates; they stay counted (:meth:`release`) and
        closed with the rest, and no hold is mapped on them, until :meth:`put_back` or
        :meth:`woken`. Raises FAILED_PRECONDITION, taking nothing, for a legacy CUDA IPC mapping."""
        with self._lock:
            chosen = [(segment_id, entry) for segment_id, entry in self._entries.items()
                      if entry.leases > 0 and (not tags or entry.tags & tags)]
            for segment_id, entry in chosen:
                if any(isinstance(m, CudaMapping) for m in entry.mappings.values()):
                    raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                                       "segment %d is mapped from a legacy CUDA IPC handle, which cannot be mapped "
                                       "again at its address: a session can sleep with --cuda-handles vmm only"
                                       % segment_id)
            for segment_id, entry in chosen:
                del self._entries[segment_id]
                entry.unmap_requested = False  # the sleep's vacated segments answer the daemon's request
                self._asleep[segment_id] = entry
        return chosen

    def sleeping(self, segment_id):
        """The entry of a segment set aside by a sleep, or None."""
        with self._lock:
            return self._asleep.get(segment_id)

    def sleeping_ids(self):
        with self._lock:
            return list(self._asleep)

    def put_back(self, segment_id):
        """A set-aside segment that did not sleep (refused, or not the daemon's choice), its
        mappings refilled: back in the table (:meth:`acquire` refused its id meanwhile)."""
        self._return(segment_id, segment_id, None)

    def woken(self, old_segment_id, handle):
        """A slept segment woke as ``handle``'s segment: its entry and mappings are that
        segment's now (every lease on them moves with them), its mappings refilled; one that
        could not be refilled leaves the table (see :func:`_forget`; not acknowledged: the
        daemon counts it unmapped since the sleep)."""
        self._return(old_segment_id, handle.segment_id, handle)

    def _return(self, old, new, handle):
        with self._lock:
            entry = self._asleep.pop(old)
            if new in self._entries:
                self._asleep[old] = entry
                raise inconsistent("the wake put sleeping segment %d into segment %d, which this process maps "
                                   "already" % (old, new))
            left = [m for m in entry.mappings.values() if m.vacated]
            entry.mappings = {key: m for key, m in entry.mappings.items() if not m.vacated}
            if handle is not None:
                entry.handle = handle
                for mapping in entry.mappings.values():
                    mapping.segment_id = new
            self._entries[new] = entry
        _forget(left)

    def drop_sleeping(self, segment_id):
        """A set-aside segment the wake does not name (its leases were released meanwhile):
        its mappings are closed (see :func:`_forget`), not acknowledged; the leases counted on it."""
        with self._lock:
            entry = self._asleep.pop(segment_id, None)
        if entry is None:
            return 0
        _forget(entry.mappings.values())
        return entry.leases


def _forget(vacated):
    """Closes vacated mappings that left the table; one a view still exports holds only its
    inaccessible range, which its finalizer releases once the last view is gone."""
    for mapping in vacated:
        _close_quietly(mapping)
