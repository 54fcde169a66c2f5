"""The few CUDA driver calls the client needs, through ctypes on libcuda.so.1.

No CUDA Python package is needed: the NVIDIA driver's library is enough. It is loaded only
when a lease carries a CUDA handle (or a CUDA helper is called), so host-only clients never
touch it. Every call runs in the device's primary context, the one that PyTorch and CuPy use,
so that pointers from here are valid there; the context is pushed for the call and popped after
it (:func:`context`), so that the caller's current context (a PyTorch thread's device) is the
same after a lease as before.

Devices are this process's ordinals here. The daemon numbers its devices its own way (it may
see every GPU of the node, a container only its own): :func:`local_device` finds a daemon
device among this process's by UUID.

The ctypes structures and the VMM import sequence follow ``shared/gpu/vmm_reference.py``,
checked on an H100 (driver 580); read-only access (PROT_READ) was not checked there.

Thread-safe: contexts are retained once per device and the UUID table is read once, under a
lock; each thread pushes and pops its own context.
"""
import contextlib
import ctypes
import threading

import grpc

from ._errors import GpumemdError
from ._replies import inconsistent

CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1
CU_EVENT_DISABLE_TIMING = 0x2
CUDA_ERROR_NOT_READY = 600
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READ = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CUDA_ERROR_INVALID_VALUE = 1

_lock = threading.Lock()
_lib = None
_contexts = {}
_uuids = None  # this process's device UUIDs, by ordinal


class IpcHandle(ctypes.Structure):
    """CUipcMemHandle: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


class MemLocation(ctypes.Structure):
    """CUmemLocation."""
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemAccessDesc(ctypes.Structure):
    """CUmemAccessDesc."""
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


class Uuid(ctypes.Structure):
    """CUuuid: 16 bytes."""
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


def _load():
    global _lib
    if _lib is not None:
        return _lib
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                           "a CUDA lease needs the NVIDIA driver (libcuda.so.1): %s" % e)
    u64, p, size = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
    flags = ctypes.c_ulonglong
    sigs = {
        "cuInit": [ctypes.c_uint],
        "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
        "cuDeviceGetCount": [ctypes.POINTER(ctypes.c_int)],
        "cuDeviceCanAccessPeer": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
        "cuDevicePrimaryCtxRetain": [ctypes.POINTER(p), ctypes.c_int],
        "cuCtxPushCurrent_v2": [p],
        "cuCtxPopCurrent_v2": [ctypes.POINTER(p)],
        "cuCtxGetCurrent": [ctypes.POINTER(p)],
        "cuCtxSynchronize": [],
        "cuIpcOpenMemHandle_v2": [ctypes.POINTER(u64), IpcHandle, ctypes.c_uint],
        "cuIpcCloseMemHandle": [u64],
        "cuMemGetAddressRange_v2": [ctypes.POINTER(u64), ctypes.POINTER(size), u64],
        "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), p, ctypes.c_int],
        "cuMemAddressReserve": [ctypes.POINTER(u64), size, size, u64, flags],
        "cuMemMap": [u64, size, size, u64, flags],
        "cuMemSetAccess": [u64, size, ctypes.POINTER(MemAccessDesc), size],
        "cuMemUnmap": [u64, size],
        "cuMemAddressFree": [u64, size],
        "cuMemRelease": [u64],
        "cuMemsetD8_v2": [u64, ctypes.c_ubyte, size],
        "cuMemcpyHtoD_v2": [u64, p, size],
        "cuMemcpyDtoH_v2": [p, u64, size],
        "cuEventCreate": [ctypes.POINTER(p), ctypes.c_uint],
        "cuEventRecord": [p, p],
        "cuEventQuery": [p],
        "cuEventDestroy_v2": [p],
        "cuStreamSynchronize": [p],
        "cuStreamCreate": [ctypes.POINTER(p), ctypes.c_uint],
        "cuStreamDestroy_v2": [p],
        "cuMemsetD8Async": [u64, ctypes.c_ubyte, size, p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    # cuDeviceGetUuid_v2, as the daemon and the Java client read it: the first version names every
    # MIG instance by its parent GPU's UUID, so two instances would look like one device. Only a
    # driver older than CUDA 11.4 lacks _v2 (and has no MIG UUIDs to tell apart): it is asked the
    # first version.
    try:
        uuid_fn = lib.cuDeviceGetUuid_v2
        uuid_fn.name_ = "cuDeviceGetUuid_v2"
    except AttributeError:
        uuid_fn = lib.cuDeviceGetUuid
        uuid_fn.name_ = "cuDeviceGetUuid"
    uuid_fn.argtypes = [ctypes.POINTER(Uuid), ctypes.c_int]
    uuid_fn.restype = ctypes.c_int
    lib.device_uuid = uuid_fn
    _lib = lib
    return lib


def error_text(result):
    text = ctypes.c_char_p()
    if _lib is None or _lib.cuGetErrorString(result, ctypes.byref(text)) != 0:
        return "?"
    return (text.value or b"?").decode(errors="replace")


def check(result, call):
    if result != 0:
        raise GpumemdError(grpc.StatusCode.INTERNAL, "%s failed: CUDA error %d (%s)"
                           % (call, result, error_text(result)))


def available():
    """True when the driver loads and reports at least one device (for tests and examples)."""
    try:
        lib = _load()
        count = ctypes.c_int()
        return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except GpumemdError:
        return False


# ---------------------------------------------------------------------------- devices

def format_uuid(raw):
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` for a CUuuid's 16 bytes, as nvidia-smi and
    the daemon print it."""
    raw = bytes(raw)
    if len(raw) != 16:
        raise ValueError("a CUDA UUID has 16 bytes, not %d" % len(raw))
    h = raw.hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def _normal(uuid):
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def match_device(daemon_device, uuid, local_uuids):
    """This process's ordinal of the daemon's device ``daemon_device`` whose UUID is ``uuid``,
    among ``local_uuids`` (this process's, by ordinal). A daemon that reports no UUID (one that
    predates ``OpenSessionResponse.devices``) is trusted to number devices as this process does.
    Raises FAILED_PRECONDITION, naming the UUID, when no visible device has it."""
    if not uuid:
        return daemon_device
    wanted = _normal(uuid)
    for ordinal, local in enumerate(local_uuids):
        if _normal(local) == wanted:
            return ordinal
    raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                       "the lease is on the daemon's device %d (%s), which this process cannot see (it sees %s): "
                       "give this process that GPU (CUDA_VISIBLE_DEVICES, the pod's GPU allocation) or lease on one "
                       "it has" % (daemon_device, uuid, ", ".join(local_uuids) or "no GPU"))


def visible_uuids():
    """The UUIDs of this process's devices, by ordinal (read once)."""
    global _uuids
    lib = _load()
    with _lock:
        if _uuids is None:
            check(lib.cuInit(0), "cuInit")
            count = ctypes.c_int()
            check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
            uuids = []
            for ordinal in range(count.value):
                dev = ctypes.c_int()
                check(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet(%d)" % ordinal)
                raw = Uuid()
                check(lib.device_uuid(ctypes.byref(raw), dev), "%s(%d)" % (lib.device_uuid.name_, ordinal))
                uuids.append(format_uuid(raw.bytes))
            _uuids = uuids
        return _uuids


def local_device(daemon_device, uuid):
    """This process's ordinal of a daemon device (see :func:`match_device`)."""
    return match_device(daemon_device, uuid, visible_uuids() if uuid else [])


# ---------------------------------------------------------------------------- contexts

def _primary_context(lib, device):
    with _lock:
        context = _contexts.get(device)
        if context is None:
            check(lib.cuInit(0), "cuInit")
            dev = ctypes.c_int()
            check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet(%d)" % device)
            context = ctypes.c_void_p()
            check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), dev), "cuDevicePrimaryCtxRetain(%d)" % device)
            _contexts[device] = context
        return context


@contextlib.contextmanager
def context(device):
    """The driver library, with the primary context of ``device`` (this process's ordinal)
    pushed on this thread for the block and popped after it: the caller's current context is
    left as it was."""
    lib = _load()
    ctx = _primary_context(lib, device)
    check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent(%d)" % device)
    try:
        yield lib
    finally:
        popped = ctypes.c_void_p()
        lib.cuCtxPopCurrent_v2(ctypes.byref(popped))


def current_context():
    """This thread's current CUcontext (an int, 0 for none): for tests of push and pop."""
    lib = _load()
    ctx = ctypes.c_void_p()
    check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    return ctx.value or 0


def synchronize(device):
    """Waits for all work of this process on ``device``'s primary context."""
    with context(device) as lib:
        check(lib.cuCtxSynchronize(), "cuCtxSynchronize")


# ---------------------------------------------------------------------------- legacy IPC

def open_mem_handle(device, handle_bytes):
    """cuIpcOpenMemHandle: the segment's base address in this process."""
    if len(handle_bytes) != 64:
        raise GpumemdError(grpc.StatusCode.INTERNAL, "CUDA IPC handle of %d bytes (expected: 64)" % len(handle_bytes))
    with context(device) as lib:
        base = ctypes.c_uint64()
        check(lib.cuIpcOpenMemHandle_v2(ctypes.byref(base), IpcHandle.from_buffer_copy(handle_bytes),
                                        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              "cuIpcOpenMemHandle on device %d" % device)
        return base.value


def address_range(device, pointer):
    """cuMemGetAddressRange: ``(base, size)`` of the allocation that holds ``pointer``."""
    with context(device) as lib:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer), "cuMemGetAddressRange")
        return base.value, size.value


def close_mem_handle(device, base):
    """Synchronizes the context (work still queued on the memory), then cuIpcCloseMemHandle.
    A list of the calls that failed (empty when all went well): closing goes on regardless."""
    failed = []
    with context(device) as lib:
        _call(lib.cuCtxSynchronize(), "cuCtxSynchronize", failed)
        _call(lib.cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle", failed)
    return failed


def _call(result, what, failed):
    if result != 0:
        failed.append("%s: CUDA error %d (%s)" % (what, result, error_text(result)))


# ---------------------------------------------------------------------------- VMM

_accessors = {}  # device -> the devices of this process that can access its memory


def accessors(device):
    """The devices of this process whose contexts can access memory on ``device`` directly
    (``cuDeviceCanAccessPeer``), ``device`` first; read once per device. A VMM mapping grants
    them the lease's access, as a legacy handle opened with ``CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS``
    lets them in, so that the two modes differ in nothing a kernel sees. A device the driver
    cannot answer for is left out (it gets no access; the lease's own device still maps)."""
    lib = _load()
    count = len(visible_uuids())
    with _lock:
        found = _accessors.get(device)
        if found is None:
            found = [device]
            owner = ctypes.c_int()
            check(lib.cuDeviceGet(ctypes.byref(owner), device), "cuDeviceGet(%d)" % device)
            for peer in range(count):
                if peer == device:
                    continue
                dev, can = ctypes.c_int(), ctypes.c_int()
                if (lib.cuDeviceGet(ctypes.byref(dev), peer) == 0
                        and lib.cuDeviceCanAccessPeer(ctypes.byref(can), dev, owner) == 0 and can.value == 1):
                    found.append(peer)
            _accessors[device] = found
        return list(found)


def import_and_map(device, fd, segment_bytes, read_only, segment_id=None):
    """Imports a VMM allocation passed as a POSIX descriptor (the caller closes ``fd``),
    reserves ``segment_bytes`` of address space, maps it and sets access for ``device``
    (read-only when asked: the driver then faults writes through this mapping).
    ``(base, handle)``; on failure, whatever was done is undone. An allocation smaller than
    ``segment_bytes`` fails ``INTERNAL``, the daemon's reply inconsistent: cuMemMap refuses to
    map past an allocation's end (its documented check, which is the size check)."""
    with context(device) as lib:
        base = ctypes.c_uint64()
        check(lib.cuMemAddressReserve(ctypes.byref(base), segment_bytes, 0, 0, 0),
              "cuMemAddressReserve(%d bytes)" % segment_bytes)
        try:
            handle = _import_at(lib, device, fd, base.value, segment_bytes, read_only, segment_id)
        except GpumemdError:
            lib.cuMemAddressFree(base, segment_bytes)
            raise
        return base.value, handle


def _import_at(lib, device, fd, base, segment_bytes, read_only, segment_id):
    """Imports ``fd`` and maps it whole at ``base``, a reserved range with nothing mapped in it,
    with the access :func:`import_and_map` gives; the imported handle. On failure the range is
    left reserved and empty, and nothing imported."""
    handle = ctypes.c_uint64()
    check(lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle on device %d" % device)
    mapped = False
    try:
        result = lib.cuMemMap(base, segment_bytes, 0, handle, 0)
        if result == CUDA_ERROR_INVALID_VALUE:
            raise inconsistent("the CUDA VMM allocation of segment %s cannot be mapped whole at segment_bytes %d "
                               "(cuMemMap: CUDA_ERROR_INVALID_VALUE: the allocation is smaller, or "
                               "segment_bytes is not a multiple of its granularity)"
                               % ("?" if segment_id is None else segment_id, segment_bytes))
        check(result, "cuMemMap")
        mapped = True
        # The lease's device and its peers, as a legacy handle opened with
        # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS lets them in (see accessors).
        flags = CU_MEM_ACCESS_FLAGS_PROT_READ if read_only else CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        devices = accessors(device)
        access = (MemAccessDesc * len(devices))(
            *[MemAccessDesc(MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, d), flags) for d in devices])
        check(lib.cuMemSetAccess(base, segment_bytes, access, len(devices)),
              "cuMemSetAccess(%s)" % ("read-only" if read_only else "read-write"))
    except GpumemdError:
        if mapped:
            lib.cuMemUnmap(base, segment_bytes)
        lib.cuMemRelease(handle)
        raise
    return handle.value


def vacate(device, base, handle, segment_bytes):
    """Synchronizes the context (work still queued on the memory), then cuMemUnmap and
    cuMemRelease of the imported handle, keeping the range reserved: :func:`refill` maps memory
    there again at the same address. Raises on a failed synchronize or unmap (nothing released
    then); a failed release is returned (the range is vacated all the same)."""
    failed = []
    with context(device) as lib:
        check(lib.cuCtxSynchronize(), "cuCtxSynchronize before vacating")
        check(lib.cuMemUnmap(base, segment_bytes), "cuMemUnmap")
        _call(lib.cuMemRelease(handle), "cuMemRelease", failed)
    return failed


def refill(device, base, fd, segment_bytes, read_only, segment_id=None):
    """Imports ``fd`` (the caller closes it) and maps it at ``base``, a range :func:`vacate`
    emptied, with read-only or read-write access as :func:`import_and_map`; the imported
    handle. On failure the range stays vacated and nothing is imported."""
    with context(device) as lib:
        return _import_at(lib, device, fd, base, segment_bytes, read_only, segment_id)


def unmap(device, base, handle, segment_bytes):
    """Synchronizes the context (work still queued on the memory), then cuMemUnmap,
    cuMemAddressFree and cuMemRelease of the imported handle, each tried whatever the one
    before did (``handle`` None: a vacated range, only freed). A list of the calls that failed
    (empty when all went well)."""
    failed = []
    with context(device) as lib:
        _call(lib.cuCtxSynchronize(), "cuCtxSynchronize", failed)
        if handle is not None:
            _call(lib.cuMemUnmap(base, segment_bytes), "cuMemUnmap", failed)
        _call(lib.cuMemAddressFree(base, segment_bytes), "cuMemAddressFree", failed)
        if handle is not None:
            _call(lib.cuMemRelease(handle), "cuMemRelease", failed)
    return failed


# ---------------------------------------------------------------------------- streams, events

def stream_handle(stream):
    """A CUstream pointer (int) from None/0, an int, a ctypes ``c_void_p``, or a stream object:
    PyTorch (``cuda_stream``), CuPy (``ptr``), Numba (``handle``, a ``c_void_p``), or one with
    the CUDA stream protocol (``__cuda_stream__()`` giving ``(version, handle)``)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream: %r (expected: a CUstream or a stream object)" % (stream,))
    if isinstance(stream, int):
        return stream
    if isinstance(stream, ctypes.c_void_p):
        return stream.value or 0
    protocol = getattr(stream, "__cuda_stream__", None)
    if callable(protocol):
        value = protocol()
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
            return value[1]
    for attribute in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy Stream, numba stream
        value = getattr(stream, attribute, None)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, ctypes.c_void_p):
            return value.value or 0
    raise TypeError("stream: %r (expected: an int CUstream, a ctypes.c_void_p, or a torch/cupy/numba stream)"
                    % (stream,))


class Event:
    """A plain event (no timing, not interprocess) recorded on a stream of ``device``'s primary
    context: the client polls it (:meth:`query`) and releases the lease once it completed.
    Destroy it (:meth:`destroy`) once done with it; destroying is idempotent."""

    def __init__(self, device, stream):
        handle = stream_handle(stream)  # TypeError before anything is created
        self.device = device
        self._event = None
        with context(device) as lib:
            event = ctypes.c_void_p()
            check(lib.cuEventCreate(ctypes.byref(event), CU_EVENT_DISABLE_TIMING), "cuEventCreate")
            result = lib.cuEventRecord(event, ctypes.c_void_p(handle))
            if result != 0:
                lib.cuEventDestroy_v2(event)
                check(result, "cuEventRecord")
        self._event = event

    def query(self):
        """True once the work recorded before the event completed, False while it runs;
        GpumemdError when the driver reports an error (the work failed, or the context is
        broken)."""
        with context(self.device) as lib:
            result = lib.cuEventQuery(self._event)
        if result == CUDA_ERROR_NOT_READY:
            return False
        check(result, "cuEventQuery")
        return True

    def destroy(self):
        event, self._event = self._event, None
        if event is not None:
            with context(self.device) as lib:
                lib.cuEventDestroy_v2(event)


# ---------------------------------------------------------------------------- helpers

def memset(device, pointer, value, size):
    """cuMemsetD8 then a context synchronize (tests and zeroing)."""
    with context(device) as lib:
        check(lib.cuMemsetD8_v2(pointer, value, size), "cuMemsetD8")
        check(lib.cuCtxSynchronize(), "cuCtxSynchronize")


def copy_to_device(device, pointer, data):
    with context(device) as lib:
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        check(lib.cuMemcpyHtoD_v2(pointer, buf, len(data)), "cuMemcpyHtoD")


def copy_from_device(device, pointer, size):
    with context(device) as lib:
        buf = ctypes.create_string_buffer(size)
        check(lib.cuMemcpyDtoH_v2(buf, pointer, size), "cuMemcpyDtoH")
        return buf.raw
