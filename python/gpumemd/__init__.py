"""gpumemd: lease GPU memory (or the host backend's shared memory) from the gpumemd daemon.

    import gpumemd, numpy
    with gpumemd.connect("unix:///tmp/gpumemd.sock", client_name="decoder-3") as gm:
        with gm.lease(device=0, size=64 << 20) as lease:
            a = numpy.asarray(lease)      # host devices; torch.as_tensor(lease, device="cuda") on CUDA
        gm.stats()

Sharing a block with other processes of the same tenant: ``lease.share()`` gives a token for
``gm.attach(token)``; ``gm.publish(lease, name)`` a name for ``gm.lookup(name)``.

PyTorch and CuPy allocate through gpumemd with ``gpumemd.torch.mem_pool(gm, device)`` (a
``torch.cuda.MemPool``) and ``gpumemd.cupy.allocator(gm, device)``; both submodules are imported
on first use, since they import their framework.

Sleep and wake: ``gm.sleep(level=1)`` frees the session's device memory while it keeps its
leases (the daemon keeps their contents in host memory, level 1, or drops them, level 2);
``gm.wake()`` brings every lease back at its old address.

See python/README.md for the protocol spoken and what is left out.
"""
from ._errors import GpumemdError
from ._lease import Lease
from ._sharing import AsyncPublished, AsyncShare, Published, Share
from ._sleep import Slept, Woken
from .client import Client, ClientStats, connect

__all__ = ["connect", "Client", "ClientStats", "Lease", "Share", "Published", "AsyncShare", "AsyncPublished",
           "GpumemdError", "Slept", "Woken", "cuda_available"]
__version__ = "0.1.0"


def __getattr__(name):
    # gpumemd.torch and gpumemd.cupy import their framework: only when asked for.
    if name in ("torch", "cupy"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'gpumemd' has no attribute %r" % name)


def cuda_available():
    """True when libcuda.so.1 loads and reports a device."""
    from . import _cuda

    return _cuda.available()
