"""ctypes bindings for the stand-in driver, shared by the tests and the subprocesses they start.
libcuda.so.1 is resolved through LD_LIBRARY_PATH (the build output directory)."""
import ctypes as C
import os

try:
    cu = C.CDLL("libcuda.so.1")
except OSError as e:
    raise RuntimeError("libcuda.so.1 not found: build it with `bash cuda-standin/build.sh OUT` and run with "
                       "LD_LIBRARY_PATH=OUT") from e

U64, SZ, VP, UINT, INT = C.c_uint64, C.c_size_t, C.c_void_p, C.c_uint, C.c_int


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Flags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte),
                ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc),
                ("win32", C.c_void_p), ("allocFlags", Flags)]


class Access(C.Structure):
    _fields_ = [("location", Loc), ("flags", C.c_int)]


class Ipc64(C.Structure):
    _fields_ = [("reserved", C.c_ubyte * 64)]


assert C.sizeof(Prop) == 32 and C.sizeof(Access) == 12 and C.sizeof(Loc) == 8

_sigs = {
    "cuInit": [UINT], "cuDeviceGetCount": [C.POINTER(INT)], "cuDeviceGet": [C.POINTER(INT), INT],
    "cuDeviceGetName": [C.c_char_p, INT, INT], "cuDeviceGetUuid": [C.c_char_p, INT], "cuDeviceGetUuid_v2": [C.c_char_p, INT],
    "cuDeviceTotalMem_v2": [C.POINTER(SZ), INT], "cuDeviceGetAttribute": [C.POINTER(INT), INT, INT],
    "cuDriverGetVersion": [C.POINTER(INT)], "cuGetErrorString": [INT, C.POINTER(C.c_char_p)],
    "cuGetErrorName": [INT, C.POINTER(C.c_char_p)],
    "cuDevicePrimaryCtxRetain": [C.POINTER(VP), INT], "cuDevicePrimaryCtxRelease_v2": [INT],
    "cuDevicePrimaryCtxReset_v2": [INT], "cuDevicePrimaryCtxGetState": [INT, C.POINTER(UINT), C.POINTER(INT)],
    "cuDevicePrimaryCtxSetFlags_v2": [INT, UINT],
    "cuCtxCreate_v2": [C.POINTER(VP), UINT, INT], "cuCtxDestroy_v2": [VP], "cuCtxSetCurrent": [VP],
    "cuCtxGetCurrent": [C.POINTER(VP)], "cuCtxPushCurrent_v2": [VP], "cuCtxPopCurrent_v2": [C.POINTER(VP)],
    "cuCtxGetDevice": [C.POINTER(INT)], "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [C.POINTER(U64), SZ], "cuMemAlloc": [C.POINTER(U64), SZ], "cuMemFree_v2": [U64], "cuMemFree": [U64],
    "cuMemGetInfo_v2": [C.POINTER(SZ), C.POINTER(SZ)], "cuMemGetAddressRange_v2": [C.POINTER(U64), C.POINTER(SZ), U64],
    "cuMemsetD8_v2": [U64, C.c_ubyte, SZ], "cuMemsetD32_v2": [U64, UINT, SZ],
    "cuMemsetD8Async": [U64, C.c_ubyte, SZ, VP], "cuMemsetD32Async": [U64, UINT, SZ, VP],
    "cuMemcpyHtoD_v2": [U64, VP, SZ], "cuMemcpyDtoH_v2": [VP, U64, SZ], "cuMemcpyDtoD_v2": [U64, U64, SZ],
    "cuMemcpyHtoDAsync_v2": [U64, VP, SZ, VP], "cuMemcpyDtoHAsync_v2": [VP, U64, SZ, VP],
    "cuIpcGetMemHandle": [C.POINTER(Ipc64), U64], "cuIpcOpenMemHandle_v2": [C.POINTER(U64), Ipc64, UINT],
    "cuIpcCloseMemHandle": [U64], "cuIpcGetEventHandle": [C.POINTER(Ipc64), VP],
    "cuIpcOpenEventHandle": [C.POINTER(VP), Ipc64],
    "cuStreamCreate": [C.POINTER(VP), UINT], "cuStreamDestroy_v2": [VP], "cuStreamSynchronize": [VP],
    "cuStreamQuery": [VP], "cuStreamWaitEvent": [VP, VP, UINT], "cuLaunchHostFunc": [VP, VP, VP],
    "cuEventCreate": [C.POINTER(VP), UINT], "cuEventDestroy_v2": [VP], "cuEventRecord": [VP, VP],
    "cuEventQuery": [VP], "cuEventSynchronize": [VP],
    "cuMemGetAllocationGranularity": [C.POINTER(SZ), C.POINTER(Prop), INT],
    "cuMemCreate": [C.POINTER(U64), SZ, C.POINTER(Prop), C.c_ulonglong], "cuMemRelease": [U64],
    "cuMemExportToShareableHandle": [C.POINTER(INT), U64, INT, C.c_ulonglong],
    "cuMemImportFromShareableHandle": [C.POINTER(U64), VP, INT],
    "cuMemAddressReserve": [C.POINTER(U64), SZ, SZ, U64, C.c_ulonglong], "cuMemAddressFree": [U64, SZ],
    "cuMemMap": [U64, SZ, SZ, U64, C.c_ulonglong], "cuMemUnmap": [U64, SZ],
    "cuMemSetAccess": [U64, SZ, C.POINTER(Access), SZ], "cuMemGetAccess": [C.POINTER(C.c_ulonglong), C.POINTER(Loc), U64],
    "cuMemRetainAllocationHandle": [C.POINTER(U64), VP],
    "cuMemGetAllocationPropertiesFromHandle": [C.POINTER(Prop), U64],
}
for _n, _a in _sigs.items():
    getattr(cu, _n).argtypes = _a
    getattr(cu, _n).restype = C.c_int

MiB = 1 << 20
POSIX_FD = 1
HOSTFN = C.CFUNCTYPE(None, C.c_void_p)


class CudaError(RuntimeError):
    def __init__(self, rc, what):
        super().__init__(f"{what}: {rc} {name(rc)}")
        self.rc = rc


def name(rc):
    s = C.c_char_p()
    return s.value.decode() if cu.cuGetErrorName(rc, C.byref(s)) == 0 else f"?{rc}"


def ck(rc, what=""):
    if rc != 0:
        raise CudaError(rc, what)


def init(dev=0):
    ck(cu.cuInit(0), "cuInit")
    ctx = C.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain")
    ck(cu.cuCtxSetCurrent(ctx), "set")
    return ctx


def alloc(n):
    d = U64()
    ck(cu.cuMemAlloc_v2(C.byref(d), n), "cuMemAlloc_v2")
    return d.value


def h2d(ptr, b):
    buf = C.create_string_buffer(b, len(b))
    ck(cu.cuMemcpyHtoD_v2(ptr, buf, len(b)), "h2d")


def d2h(ptr, n):
    buf = C.create_string_buffer(n)
    ck(cu.cuMemcpyDtoH_v2(buf, ptr, n), "d2h")
    return buf.raw


def prop(dev=0, handle_types=POSIX_FD):
    p = Prop()
    p.type = 1
    p.requestedHandleTypes = handle_types
    p.location = Loc(1, dev)
    return p


def access(flags=3, dev=0):
    return Access(Loc(1, dev), flags)


def gran(dev=0):
    g = SZ()
    ck(cu.cuMemGetAllocationGranularity(C.byref(g), C.byref(prop(dev)), 0), "granularity")
    return g.value


def vmm_create(size, handle_types=POSIX_FD, dev=0):
    h = U64()
    ck(cu.cuMemCreate(C.byref(h), size, C.byref(prop(dev, handle_types)), 0), "cuMemCreate")
    return h.value


def vmm_map(h, size, flags=3, dev=0):
    """reserve + map + set access; returns the address"""
    p = U64()
    ck(cu.cuMemAddressReserve(C.byref(p), size, 0, 0, 0), "reserve")
    ck(cu.cuMemMap(p.value, size, 0, h, 0), "map")
    a = access(flags, dev)
    ck(cu.cuMemSetAccess(p.value, size, C.byref(a), 1), "access")
    return p.value


def vmm_unmap(p, size):
    ck(cu.cuMemUnmap(p, size), "unmap")
    ck(cu.cuMemAddressFree(p, size), "address free")


def export_fd(h):
    fd = C.c_int()
    ck(cu.cuMemExportToShareableHandle(C.byref(fd), h, POSIX_FD, 0), "export")
    return fd.value


def import_fd(fd):
    h = U64()
    ck(cu.cuMemImportFromShareableHandle(C.byref(h), C.c_void_p(fd), POSIX_FD), "import")
    return h.value


def ipc_get(ptr):
    h = Ipc64()
    ck(cu.cuIpcGetMemHandle(C.byref(h), ptr), "cuIpcGetMemHandle")
    return bytes(h.reserved)


def ipc_handle(b):
    h = Ipc64()
    C.memmove(C.addressof(h), b, 64)
    return h


def ipc_open(b, flags=1):
    d = U64()
    rc = cu.cuIpcOpenMemHandle_v2(C.byref(d), ipc_handle(b), flags)
    return rc, d.value


def mem_info():
    f, t = SZ(), SZ()
    ck(cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)), "cuMemGetInfo_v2")
    return f.value, t.value


def stream(flags=0):
    s = C.c_void_p()
    ck(cu.cuStreamCreate(C.byref(s), flags), "stream")
    return s


def event(flags=0):
    e = C.c_void_p()
    ck(cu.cuEventCreate(C.byref(e), flags), "event")
    return e


def peek(ptr, n):
    """CPU read of device memory (device memory is host memory in the stand-in)"""
    return C.string_at(ptr, n)
