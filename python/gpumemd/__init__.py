"""gpumemd: lease GPU memory (or the host backend's shared memory) from the gpumemd daemon.

    import gpumemd, numpy
    with gpumemd.connect("unix:///tmp/gpumemd.sock", client_name="decoder-3") as gm:
        with gm.lease(device=0, size=64 << 20) as lease:
            a = numpy.asarray(lease)      # host devices; torch.as_tensor(lease, device="cuda") on CUDA
        gm.stats()

Sharing a block with other processes of the same tenant: ``lease.share()`` gives a token for
``gm.attach(token)``; ``gm.publish(lease, name)`` a name for ``gm.lookup(name)``.

See python/README.md for the protocol spoken and what is left out.
"""
from ._errors import GpumemdError
from ._lease import Lease
from ._sharing import AsyncPublished, AsyncShare, Published, Share
from .client import Client, ClientStats, connect

__all__ = ["connect", "Client", "ClientStats", "Lease", "Share", "Published", "AsyncShare", "AsyncPublished",
           "GpumemdError", "cuda_available"]
__version__ = "0.1.0"


def cuda_available():
    """True when libcuda.so.1 loads and reports a device."""
    from . import _cuda

    return _cuda.available()
