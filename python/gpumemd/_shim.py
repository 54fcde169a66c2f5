"""The allocator shim (``_alloc_shim.c``): built with the system C compiler on first use,
cached, and loaded with ctypes.

Why a C file: PyTorch's public ``CUDAPluggableAllocator(path, alloc_name, free_name)`` wants a
shared object and two symbol names, and the shim's free entry point never takes the GIL (it
queues the free in C; see the comment at the top of ``_alloc_shim.c``). It needs no Python or
CUDA headers, so a C compiler is all it takes. Without one, :func:`load` raises and the PyTorch
allocator falls back to ctypes callbacks handed to PyTorch's private
``torch._C._cuda_customAllocator`` (see :mod:`gpumemd.torch`).

The cache: ``$GPUMEMD_SHIM_DIR``, else ``$XDG_CACHE_HOME/gpumemd``, else ``~/.cache/gpumemd``;
the file is ``alloc_shim-<hash>.so``, the hash of the C source and the machine, so a changed
shim builds anew. The compiler is ``$CC``, else ``cc``. The build writes a temporary file and
renames it into place, so processes building at once do not see each other's half-written file.

Thread-safe: one load per process, under a lock; slots are handed out under it.
"""
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading

import grpc

from ._errors import GpumemdError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_alloc_shim.c")

_lock = threading.Lock()
_shim = None


class ShimUnavailable(GpumemdError):
    """The shim cannot be built here (no C compiler, or the build failed): FAILED_PRECONDITION,
    with the reason."""

    def __init__(self, message):
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, message)


class Freed(ctypes.Structure):
    """gpumemd_freed: one free that PyTorch made, queued by the shim."""
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_ssize_t), ("device", ctypes.c_int),
                ("slot", ctypes.c_int), ("stream", ctypes.c_void_p)]


ALLOC_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)


def cache_dir():
    explicit = os.environ.get("GPUMEMD_SHIM_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpumemd")


def _library_path():
    with open(SOURCE, "rb") as f:
        source = f.read()
    digest = hashlib.sha256(source + platform.machine().encode() + platform.system().encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), "alloc_shim-%s.so" % digest)


def build(path=None):
    """Compiles the shim into ``path`` (default: the cache) unless it is there; the path."""
    path = path or _library_path()
    if os.path.exists(path):
        return path
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise ShimUnavailable("the gpumemd allocator shim needs a C compiler to build %s: %s not found "
                              "(set CC, or install gcc)" % (path, compiler))
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".alloc_shim-", suffix=".so", dir=directory)
    os.close(fd)
    try:
        result = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-pthread", "-o", tmp, SOURCE],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise ShimUnavailable("building the gpumemd allocator shim failed (%s, exit %d): %s"
                                  % (compiler, result.returncode, (result.stderr or result.stdout).strip()[-2000:]))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


class Shim:
    """The loaded shim: its path, its slots and the free queue."""

    def __init__(self, path):
        self.path = path
        lib = ctypes.CDLL(path)  # CDLL: the GIL is released around every call into it
        lib.gpumemd_slots.restype = ctypes.c_int
        lib.gpumemd_set_alloc.argtypes = [ctypes.c_int, ALLOC_CALLBACK]
        lib.gpumemd_set_alloc.restype = ctypes.c_int
        lib.gpumemd_take_freed.argtypes = [ctypes.POINTER(Freed), ctypes.c_int, ctypes.c_int]
        lib.gpumemd_take_freed.restype = ctypes.c_int
        lib.gpumemd_pending_frees.restype = ctypes.c_int
        lib.gpumemd_lost_frees.restype = ctypes.c_ulonglong
        lib.gpumemd_enqueued_total.restype = ctypes.c_ulonglong
        self.lib = lib
        self.slots = lib.gpumemd_slots()
        self._next_slot = 0
        self._callbacks = []  # the CFUNCTYPE objects: PyTorch may call them until the process ends

    def take_slot(self, callback):
        """A free slot for ``callback(size, device, stream) -> pointer or 0``: the names of its
        alloc and free entry points. Slots are never given back (PyTorch may call a slot's
        functions as long as a pool may hold its blocks, up to the process's end)."""
        with _lock:
            if self._next_slot >= self.slots:
                raise GpumemdError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   "the gpumemd allocator shim has %d slots and all are taken: one per client "
                                   "and device; reuse the pool of a client and device" % self.slots)
            slot = self._next_slot
            self._next_slot += 1
            c_callback = ALLOC_CALLBACK(callback)
            self._callbacks.append(c_callback)
        if self.lib.gpumemd_set_alloc(slot, c_callback) != 0:
            raise GpumemdError(grpc.StatusCode.INTERNAL, "gpumemd_set_alloc(%d) failed" % slot)
        return slot, "gpumemd_alloc_%d" % slot, "gpumemd_free_%d" % slot

    def function(self, name):
        return getattr(self.lib, name)

    def take_freed(self, max_items=64, wait_ms=0):
        """Queued frees, oldest first (up to ``max_items``), waiting up to ``wait_ms`` (negative:
        without end) when none is queued; a list of (slot, ptr, size, device, stream)."""
        buffer = (Freed * max_items)()
        n = self.lib.gpumemd_take_freed(buffer, max_items, wait_ms)
        return [(f.slot, f.ptr or 0, f.size, f.device, f.stream or 0) for f in buffer[:n]]

    def pending_frees(self):
        return self.lib.gpumemd_pending_frees()

    def enqueued_total(self):
        return self.lib.gpumemd_enqueued_total()

    def lost_frees(self):
        return self.lib.gpumemd_lost_frees()


def load():
    """The process's shim, built on first use. Raises :class:`ShimUnavailable` when it cannot be
    built (no compiler)."""
    global _shim
    with _lock:
        if _shim is None:
            _shim = Shim(build())
        return _shim
