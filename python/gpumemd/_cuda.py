"""The few CUDA driver calls the client needs, through ctypes on libcuda.so.1.

No CUDA Python package is needed: the NVIDIA driver's library is enough. It is loaded only
when a lease carries a CUDA IPC handle (or a CUDA helper is called), so host-only clients
never touch it. Every call runs in the device's primary context, the one that PyTorch and
CuPy use, so that pointers from here are valid there.

Thread-safe: contexts are retained once per device under a lock; each call makes the device's
primary context current on the calling thread.
"""
import ctypes
import threading

import grpc

from ._errors import GpumemdError

CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1
CU_EVENT_DISABLE_TIMING = 0x2
CU_EVENT_INTERPROCESS = 0x4

_lock = threading.Lock()
_lib = None
_contexts = {}


class IpcHandle(ctypes.Structure):
    """CUipcMemHandle / CUipcEventHandle: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _load():
    global _lib
    if _lib is not None:
        return _lib
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                           "a CUDA lease needs the NVIDIA driver (libcuda.so.1): %s" % e)
    u64, p = ctypes.c_uint64, ctypes.c_void_p
    sigs = {
        "cuInit": [ctypes.c_uint],
        "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
        "cuDeviceGetCount": [ctypes.POINTER(ctypes.c_int)],
        "cuDevicePrimaryCtxRetain": [ctypes.POINTER(p), ctypes.c_int],
        "cuCtxSetCurrent": [p],
        "cuCtxSynchronize": [],
        "cuIpcOpenMemHandle_v2": [ctypes.POINTER(u64), IpcHandle, ctypes.c_uint],
        "cuIpcCloseMemHandle": [u64],
        "cuMemsetD8_v2": [u64, ctypes.c_ubyte, ctypes.c_size_t],
        "cuMemcpyHtoD_v2": [u64, p, ctypes.c_size_t],
        "cuMemcpyDtoH_v2": [p, u64, ctypes.c_size_t],
        "cuEventCreate": [ctypes.POINTER(p), ctypes.c_uint],
        "cuEventRecord": [p, p],
        "cuEventDestroy_v2": [p],
        "cuIpcGetEventHandle": [ctypes.POINTER(IpcHandle), p],
        "cuStreamSynchronize": [p],
        "cuStreamCreate": [ctypes.POINTER(p), ctypes.c_uint],
        "cuStreamDestroy_v2": [p],
        "cuMemsetD8Async": [u64, ctypes.c_ubyte, ctypes.c_size_t, p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    _lib = lib
    return lib


def check(result, call):
    if result != 0:
        text = ctypes.c_char_p()
        _lib.cuGetErrorString(result, ctypes.byref(text))
        raise GpumemdError(grpc.StatusCode.INTERNAL, "%s failed: CUDA error %d (%s)"
                           % (call, result, (text.value or b"?").decode(errors="replace")))


def available():
    """True when the driver loads and reports at least one device (for tests and examples)."""
    try:
        lib = _load()
        count = ctypes.c_int()
        return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except GpumemdError:
        return False


def make_current(device):
    """Makes the primary context of ``device`` current on this thread, retaining it once."""
    lib = _load()
    with _lock:
        context = _contexts.get(device)
        if context is None:
            check(lib.cuInit(0), "cuInit")
            dev = ctypes.c_int()
            check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet(%d)" % device)
            context = ctypes.c_void_p()
            check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), dev), "cuDevicePrimaryCtxRetain(%d)" % device)
            _contexts[device] = context
    check(lib.cuCtxSetCurrent(context), "cuCtxSetCurrent(%d)" % device)
    return lib


def open_mem_handle(device, handle_bytes):
    """cuIpcOpenMemHandle: the segment's base address in this process."""
    if len(handle_bytes) != 64:
        raise GpumemdError(grpc.StatusCode.INTERNAL, "CUDA IPC handle of %d bytes (expected: 64)" % len(handle_bytes))
    lib = make_current(device)
    base = ctypes.c_uint64()
    check(lib.cuIpcOpenMemHandle_v2(ctypes.byref(base), IpcHandle.from_buffer_copy(handle_bytes), CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
          "cuIpcOpenMemHandle on device %d" % device)
    return base.value


def close_mem_handle(device, base):
    check(make_current(device).cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle")


def stream_handle(stream):
    """A CUstream pointer from None/0, an int, or a PyTorch / CuPy / Numba stream object."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attribute in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy Stream, numba stream
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    raise TypeError("stream: %r (expected: an int CUstream, or a torch/cupy/numba stream)" % (stream,))


def record_ipc_event(device, stream):
    """Records an interprocess event on ``stream``: (its 64-byte IPC handle, the event).

    The caller destroys the event with :func:`destroy_event` once the daemon has opened its own
    reference (the unary Release has returned): an IPC event freed before its importer opened
    it is undefined behaviour.
    """
    lib = make_current(device)
    event = ctypes.c_void_p()
    check(lib.cuEventCreate(ctypes.byref(event), CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    try:
        check(lib.cuEventRecord(event, ctypes.c_void_p(stream_handle(stream))), "cuEventRecord")
        handle = IpcHandle()
        check(lib.cuIpcGetEventHandle(ctypes.byref(handle), event), "cuIpcGetEventHandle")
    except GpumemdError:
        lib.cuEventDestroy_v2(event)
        raise
    # Not handle.reserved: a c_char array reads as bytes cut at the first NUL.
    return ctypes.string_at(ctypes.addressof(handle), 64), event


def destroy_event(device, event):
    make_current(device).cuEventDestroy_v2(event)


def memset(device, pointer, value, size):
    """cuMemsetD8 then a context synchronize (tests and zeroing)."""
    lib = make_current(device)
    check(lib.cuMemsetD8_v2(pointer, value, size), "cuMemsetD8")
    check(lib.cuCtxSynchronize(), "cuCtxSynchronize")


def copy_to_device(device, pointer, data):
    lib = make_current(device)
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    check(lib.cuMemcpyHtoD_v2(pointer, buf, len(data)), "cuMemcpyHtoD")


def copy_from_device(device, pointer, size):
    lib = make_current(device)
    buf = ctypes.create_string_buffer(size)
    check(lib.cuMemcpyDtoH_v2(buf, pointer, size), "cuMemcpyDtoH")
    return buf.raw
