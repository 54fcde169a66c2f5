"""A lease: a block of device memory this process holds until it closes it."""
import ctypes
import threading

import grpc

from . import _cuda
from ._errors import GpumemdError, closed_lease


class Lease:
    """A leased block: ``size`` bytes on ``device``, at ``offset`` in segment ``segment_id``.

    Host devices: :meth:`buffer` is a writable ``memoryview`` of exactly ``size`` bytes over the
    shared memory itself, and ``numpy.asarray(lease)`` a ``uint8`` array over the same bytes.
    CUDA devices: :attr:`device_ptr` is the block's address in this process (the device's
    primary context), and ``__cuda_array_interface__`` (version 3) lets PyTorch, CuPy and Numba
    use it without a copy: ``torch.as_tensor(lease, device="cuda")``.

    Close it (or leave a ``with`` block) to give the block back; :meth:`close` is idempotent.
    The client may keep a closed lease's block in its cache tier and hand it out again, as a new
    Lease object with the same id (:attr:`local_hit` True); the closed object stays closed.
    After close every accessor raises :class:`GpumemdError` (``FAILED_PRECONDITION``) and the
    memoryview handed out by :meth:`buffer` is released, so that it cannot reach memory the
    daemon may lease to someone else. Arrays made from the buffer (numpy) cannot be revoked:
    they keep the segment mapped, so they never touch unmapped memory, but the block may hold
    another holder's data once the lease is closed. CUDA tensors built on
    ``__cuda_array_interface__`` must not be used after close at all (CUDA has no way to keep
    them safe). Thread-safe.

    A hold on another lease's block (:meth:`Client.attach`, :meth:`Client.lookup`) is a Lease
    too, with :attr:`attached` True: the same block, mapped the same way, and ``close()`` drops
    this process's hold (the block returns to the pool once its last hold is gone). A read-only
    hold (:attr:`read_only`) has a read-only :meth:`buffer` on the host backend (writes raise
    ``TypeError``, and numpy arrays over it are not writeable); on a CUDA VMM segment it has a
    mapping of its own with read-only access, so the driver faults writes through it; with a
    legacy CUDA IPC handle the flag is advisory: such a handle cannot be opened read-only, so
    nothing enforces it. ``__cuda_array_interface__`` says writable either way, since PyTorch
    refuses read-only arrays.

    While its session sleeps (:meth:`Client.sleep`) the lease may sleep (:attr:`asleep`): it
    keeps its id, address and views, but its memory is gone and touching it faults (SIGSEGV on
    the host backend); :meth:`Client.wake` brings it back at the same address, in the segment
    the wake gave (:attr:`segment_id` changes, :attr:`offset` does not). Closing a sleeping
    lease releases it (its contents are dropped).

    If the session that granted it is lost (the daemon restarted), the lease is dead:
    :attr:`lost` is True, :meth:`close` does nothing, and the accessors raise
    :class:`GpumemdError` (``UNAVAILABLE``, "session lost"). A buffer or array taken earlier keeps
    the old daemon's memory mapped (never a new lease's); lease again for usable memory.
    """

    def __init__(self, client, response, mapping, tag, stream=None, session=None, read_only=False,
                 attached=False):
        self._client = client
        self._session = session  # the client's session that granted it (sync client)
        self.id = response.lease_id
        self.device = response.device
        self.size = response.size_bytes
        self.block_bytes = response.block_bytes
        self.pool_hit = response.pool_hit
        #: True when the client cache tier served it (no round trip to the daemon).
        self.local_hit = False
        self._shared = False  # shared or published: never kept in the client cache tier
        self.offset = response.handle.offset
        self.tag = tag
        #: True for a read-only hold (see the class notes).
        self.read_only = read_only
        #: True for a hold taken by :meth:`Client.attach` or :meth:`Client.lookup`.
        self.attached = attached
        self._mapping = mapping
        self._view = None
        self._closed = False
        self._release = None
        self._lock = threading.Lock()
        #: The stream that ``__cuda_array_interface__`` reports: consumers synchronize on it
        #: before they use the memory. None (the default) says the memory is ready now, which
        #: is true at hand-out; set it to the stream that last wrote the block when you pass
        #: the lease on. An int CUstream or a torch/cupy stream object.
        self.stream = stream

    def _reused(self, size, tag, stream):
        """A new lease object on this closed lease's block, which the client cache tier kept:
        the same id, block and mapping, ``size`` bytes of it. This object stays closed (a
        reference kept to it cannot reach the block again)."""
        lease = self.__class__.__new__(self.__class__)
        lease.__dict__.update(self.__dict__)
        lease.size = size
        lease.tag = tag
        lease.stream = stream
        lease.local_hit = True
        lease.pool_hit = True
        lease._view = None
        lease._closed = False
        lease._release = None
        lease._lock = threading.Lock()
        return lease

    def _zero_block(self):
        """Zeroes the whole block, as the daemon does for ``zero=True`` (a local hit)."""
        if self.is_host:
            ctypes.memset(self._mapping.address + self.offset, 0, self.block_bytes)
        else:
            _cuda.memset(self._mapping.device, self._mapping.base + self.offset, 0, self.block_bytes)

    @property
    def segment_id(self):
        """The segment the block is in: the mapping's, which a wake moves to another segment."""
        return self._mapping.segment_id

    @property
    def asleep(self):
        """True while the lease sleeps (see :meth:`Client.sleep`): touching its memory faults."""
        return self._mapping.vacated

    @property
    def is_host(self):
        return self._mapping.kind == "host"

    @property
    def closed(self):
        return self._closed

    @property
    def lost(self):
        """True once the session that granted this lease is lost (the daemon restarted or ended it)."""
        return self._session is not None and self._session.lost

    def _check_open(self):
        if self._closed:
            raise closed_lease(self.id)
        if self.lost:
            raise GpumemdError(grpc.StatusCode.UNAVAILABLE,
                               "lease %s: session lost: the daemon restarted or ended the session; lease again"
                               % self.id)

    # ------------------------------------------------------------------ host memory

    def buffer(self):
        """A memoryview of exactly ``size`` bytes over the block (host devices); writable,
        except for a read-only hold."""
        with self._lock:
            self._check_open()
            if not self.is_host:
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "lease %s is on CUDA device %d: use device_ptr or __cuda_array_interface__"
                                   % (self.id, self.device))
            if self._view is None:
                self._view = self._mapping.view(self.offset, self.size)
            return self._view

    def __array__(self, dtype=None, copy=None):
        """``numpy.asarray(lease)``: a uint8 array over the block, no copy (host devices)."""
        import numpy

        if not self.is_host:
            raise TypeError("lease %s is on CUDA device %d: numpy cannot address device memory "
                            "(use torch.as_tensor(lease, device='cuda') or cupy.asarray(lease))"
                            % (self.id, self.device))
        if copy:
            array = numpy.array(self.buffer(), dtype=numpy.uint8, copy=True)
        else:
            array = numpy.frombuffer(self.buffer(), dtype=numpy.uint8)
        return array if dtype is None else array.astype(dtype, copy=False)

    def __len__(self):
        return self.size

    # ------------------------------------------------------------------ CUDA memory

    @property
    def device_ptr(self):
        """The block's device address in this process (CUDA devices)."""
        with self._lock:
            self._check_open()
            if self.is_host:
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "lease %s is on host device %d: use buffer()" % (self.id, self.device))
            return self._mapping.base + self.offset

    @property
    def cuda_device(self):
        """This process's ordinal of the lease's GPU (CUDA devices): :attr:`device` is the
        daemon's, which a container may number differently; the client finds its own by UUID."""
        with self._lock:
            self._check_open()
            if self.is_host:
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "lease %s is on host device %d" % (self.id, self.device))
            return self._mapping.device

    @property
    def __cuda_array_interface__(self):
        if self.is_host:
            # AttributeError, so that hasattr() says no and libraries fall back to the buffer
            raise AttributeError("lease %s is on host device %d: no __cuda_array_interface__"
                                 % (self.id, self.device))
        stream = None if self.stream is None else _cuda.stream_handle(self.stream)
        if stream == 0:
            stream = 1  # version 3 forbids 0 (ambiguous): 1 is the legacy default stream
        # "data": (pointer, False) even for a read-only hold: PyTorch refuses read-only arrays
        # ("the read only flag is not supported"), and CUDA could not enforce it anyway.
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.device_ptr, False),
                "version": 3, "strides": None, "stream": stream}

    # ------------------------------------------------------------------ sharing

    def share(self, expires_after=None, read_only=False, max_attaches=0):
        """A share token for this block (a :class:`gpumemd.Share`): another process of the same
        tenant passes it to :meth:`Client.attach` for a hold of its own.

        ``expires_after``: seconds the token stays valid (None: the daemon's default, 300 s;
        the daemon may lower it, see ``Share.expires_after_seconds``). ``read_only``: holds
        taken with it are read-only (always, when this lease is itself a read-only hold).
        ``max_attaches``: 0 = any number until it expires, 1 = a one-shot hand-off.

        The token holds the block while it is valid, even after this lease is closed and this
        process has exited. ``with lease.share() as s:`` revokes it at the end of the block, so
        use ``with`` only when the consumer attaches within it. In :mod:`gpumemd.aio`:
        ``await lease.share(...)``.
        """
        self._require_open()
        self._shared = True  # the token holds the block: its close must release, not cache it
        return self._client._share(self, expires_after, read_only or self.read_only, max_attaches)

    def _require_open(self):
        with self._lock:
            self._check_open()

    # ------------------------------------------------------------------ closing

    def close(self, after=None):
        """Gives the block back; harmless when already closed.

        ``after`` (CUDA devices): a stream (int CUstream, ``ctypes.c_void_p``, torch/cupy/numba
        stream): the daemon reuses the block only once the work queued on that stream so far has
        completed. An event recorded on it stays in this process; a client thread (a task in
        :mod:`gpumemd.aio`) polls it and sends the release once it has completed, so the call
        does not wait for the GPU. If that work fails (the event reports an error), the lease is
        not released: the session's end gives it back. If the client closes first, it waits a
        bounded time (its ``timeout``) for the event, then gives the lease up with the session.
        On a host device there is no GPU work to wait for, and ``after`` raises
        ``FAILED_PRECONDITION`` (the lease stays open), so that a CUDA-ordering mistake does not
        pass silently.
        """
        with self._lock:
            if self._closed:
                return
            if self.lost:
                self._closed = True
                self._view = None  # its mapping is the lost session's: nothing to give back
                return
            if after is not None and self.is_host:
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "close(after=...) orders a release after GPU work; lease %s is on host device %d"
                                   % (self.id, self.device))
            event = None
            if after is not None:
                event = _cuda.Event(self._mapping.device, after)  # this process's ordinal
            self._closed = True
            view, self._view = self._view, None
        if view is not None:
            try:
                view.release()
            except BufferError:
                pass  # an array still exports it: the mapping stays until that array is gone
        self._release = self._client._close_lease(self, event)  # an awaitable from gpumemd.aio

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "Lease(%s, device %d, %d bytes, segment %d + %d%s%s)" % (
            self.id, self.device, self.size, self.segment_id, self.offset,
            (", read-only hold" if self.read_only else ", hold") if self.attached else "",
            ", closed" if self._closed else ", session lost" if self.lost else "")
