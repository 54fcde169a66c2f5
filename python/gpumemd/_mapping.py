"""This process's segment mappings: one per segment id, shared by every lease on it.

A host segment is its shared-memory file mapped whole with ``mmap`` (a lease is a slice of
it); a CUDA segment is opened once with ``cuIpcOpenMemHandle`` (CUDA allows one open per
context). A mapping outlives its last lease, since the next lease is likely to land on the same
segment; it is closed when the daemon asks (``UnmapSegment``: it wants to free the segment) and
no live lease uses it, or when the client closes.

A host mapping cannot be closed while Python objects still export its memory (a numpy array
made from a closed lease's buffer, say): ``mmap.close`` refuses, so nothing can touch unmapped
memory. Such a mapping waits, unacknowledged, and is tried again on the client's next
operations; the daemon frees the segment only after the acknowledgement.

Thread-safe: the table is guarded by one lock; mappings are closed and acknowledged outside it.
"""
import mmap
import os
import threading

import grpc

from . import _cuda
from ._errors import GpumemdError


class HostMapping:
    kind = "host"

    def __init__(self, device, path, segment_bytes):
        self.device = device
        self.path = path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "cannot open host segment %s: %s" % (path, e))
        try:
            self.mmap = mmap.mmap(fd, segment_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError) as e:
            raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "cannot map host segment %s: %s" % (path, e))
        finally:
            os.close(fd)  # mmap keeps its own descriptor until it is closed

    def view(self, offset, size):
        return memoryview(self.mmap)[offset:offset + size]

    def try_close(self):
        """Unmaps; False while exported buffers (memoryviews, numpy arrays) still use it."""
        try:
            self.mmap.close()
            return True
        except BufferError:
            return False


class CudaMapping:
    kind = "cuda"

    def __init__(self, device, handle_bytes):
        self.device = device
        self.base = _cuda.open_mem_handle(device, handle_bytes)
        self._closed = False

    def try_close(self):
        if not self._closed:
            self._closed = True
            _cuda.close_mem_handle(self.device, self.base)
        return True


class _Entry:
    __slots__ = ("mapping", "leases", "unmap_requested")

    def __init__(self, mapping):
        self.mapping = mapping
        self.leases = 0
        self.unmap_requested = False


class MappingCache:
    def __init__(self, ack_unmapped):
        """``ack_unmapped(segment_id)`` is called once a requested unmap is done."""
        self._ack = ack_unmapped
        self._lock = threading.Lock()
        self._entries = {}
        self._waiting = {}  # segment id -> (mapping, ack): closed by us, refused by mmap for now
        self.maps_opened = 0

    def acquire(self, device, handle):
        """The mapping of a lease's segment (a MemoryHandle), opened on first use; counts the lease."""
        segment_id = handle.segment_id
        with self._lock:
            entry = self._entries.get(segment_id)
            if entry is None:
                waiting = self._waiting.pop(segment_id, None)
                if waiting is not None:
                    mapping = waiting[0]  # never unmapped, still valid: take it back
                else:
                    kind = handle.WhichOneof("kind")
                    if kind == "host_shm_path":
                        mapping = HostMapping(device, handle.host_shm_path, handle.segment_bytes)
                    elif kind == "cuda_ipc_handle":
                        mapping = CudaMapping(device, handle.cuda_ipc_handle)
                    else:
                        raise GpumemdError(grpc.StatusCode.INTERNAL, "lease response carries no memory handle")
                    self.maps_opened += 1
                entry = self._entries[segment_id] = _Entry(mapping)
            entry.leases += 1
            return entry.mapping

    def release(self, segment_id):
        """A lease on the segment closed."""
        to_close = None
        with self._lock:
            entry = self._entries.get(segment_id)
            if entry is not None:
                entry.leases -= 1
                if entry.leases == 0 and entry.unmap_requested:
                    del self._entries[segment_id]
                    to_close = entry.mapping
        if to_close is not None:
            self._close(segment_id, to_close, True)
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
            self._close(segment_id, entry.mapping, True)

    def _close(self, segment_id, mapping, ack):
        if mapping.try_close():
            if ack:
                self._ack(segment_id)
        else:
            with self._lock:
                self._waiting[segment_id] = (mapping, ack)

    def retry(self):
        """Closes the mappings that exported buffers held open, if they are gone now."""
        with self._lock:
            waiting = list(self._waiting.items())
        for segment_id, (mapping, ack) in waiting:
            if mapping.try_close():
                with self._lock:
                    if self._waiting.get(segment_id, (None,))[0] is not mapping:
                        continue
                    del self._waiting[segment_id]
                if ack:
                    self._ack(segment_id)

    def __len__(self):
        with self._lock:
            return len(self._entries)

    def close_all(self):
        """Closes every mapping (the client closes). Host mappings still exported stay mapped
        until the last exporting object is gone (the mmap object then unmaps itself)."""
        with self._lock:
            mappings = [e.mapping for e in self._entries.values()] + [m for m, _ in self._waiting.values()]
            self._entries.clear()
            self._waiting.clear()
        for mapping in mappings:
            try:
                mapping.try_close()
            except GpumemdError:
                pass
