"""Issue 33 item 2: the CuPy allocator orders a release after the stream the memory was allocated
on (CuPy calls an allocator on the allocating thread, its current stream and device then), not
the stream current when the array is dropped; an event that cannot be recorded keeps the lease,
with a warning, until the session ends.

CuPy is not needed: a stand-in ``cupy`` module (the few names gpumemd.cupy uses) is put in
``sys.modules``; the leases are real CUDA leases (the stand-in driver, or a GPU), so that the
release goes through ``Lease.close(after=...)`` and a real event. test_alloc_gpu.py has the same
case with CuPy itself, for a GPU."""
import ctypes
import gc
import importlib
import logging
import sys
import types

import grpc
import pytest

import gpumemd
from gpumemd import _cuda
from gpumemd._errors import GpumemdError
from conftest import Daemon

pytestmark = pytest.mark.skipif(not gpumemd.cuda_available(),
                                reason="CUDA tests skipped: no CUDA driver or device")

SIZE = 2 << 20


class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


def _fake_cupy(current):
    """The names gpumemd.cupy uses; ``current[0]`` is the current stream."""
    cupy = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()
    cuda.get_current_stream = lambda: current[0]
    cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0)
    cuda.UnownedMemory = lambda ptr, size, owner, device: types.SimpleNamespace(ptr=ptr, owner=owner)
    cuda.MemoryPointer = lambda memory, offset: types.SimpleNamespace(mem=memory, ptr=memory.ptr + offset)
    cuda.memory = types.SimpleNamespace(OutOfMemoryError=MemoryError)
    cupy.cuda = cuda
    return cupy


@pytest.fixture
def setup(tmp_path, monkeypatch):
    current = [_Stream(0)]
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(current))
    monkeypatch.delitem(sys.modules, "gpumemd.cupy", raising=False)
    module = importlib.import_module("gpumemd.cupy")
    daemon = Daemon(str(tmp_path / "d"), "--backend", "cuda", "--device-limit-bytes", "64MiB")
    gm = gpumemd.connect(daemon.target)
    streams = []
    with _cuda.context(0) as lib:
        for _ in range(2):
            s = ctypes.c_void_p()
            _cuda.check(lib.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
            streams.append(s.value)
    recorded = []
    real_event = _cuda.Event

    def event(device, stream):
        recorded.append((device, _cuda.stream_handle(stream)))
        return real_event(device, stream)

    monkeypatch.setattr(_cuda, "Event", event)
    yield types.SimpleNamespace(module=module, gm=gm, daemon=daemon, current=current, streams=streams,
                                recorded=recorded)
    gm.close()
    daemon.stop()
    with _cuda.context(0) as lib:
        for s in streams:
            lib.cuStreamDestroy_v2(s)
    sys.modules.pop("gpumemd.cupy", None)


def test_release_is_ordered_after_the_allocation_stream_not_the_one_current_at_free(setup):
    allocation_stream, other = setup.streams
    allocator = setup.module.Allocator(setup.gm, 0)
    setup.current[0] = _Stream(allocation_stream)
    pointer = allocator(SIZE)
    setup.current[0] = _Stream(other)  # the array is dropped while another stream is current
    del pointer
    gc.collect()
    assert setup.recorded == [(0, allocation_stream)], "the event goes on the allocation's stream"
    assert allocator.gpumemd.kept() == []


def test_an_event_that_cannot_be_recorded_keeps_the_lease_with_a_warning(setup, monkeypatch, caplog):
    allocator = setup.module.Allocator(setup.gm, 0)
    setup.current[0] = _Stream(setup.streams[0])
    pointer = allocator(SIZE)
    lease_id = allocator.gpumemd.leases()[0].id

    monkeypatch.setattr(_cuda, "Event", lambda device, stream: (_ for _ in ()).throw(
        GpumemdError(grpc.StatusCode.INTERNAL, "cuEventRecord: CUDA error 400 (invalid resource handle)")))
    with caplog.at_level(logging.WARNING, logger="gpumemd"):
        del pointer
        gc.collect()
    assert [lease.id for lease in allocator.gpumemd.kept()] == [lease_id]
    assert any(lease_id in r.getMessage() and "kept" in r.getMessage() for r in caplog.records), caplog.text
    assert [e.lease_id for e in setup.daemon.leases()] == [lease_id], "still leased until the session ends"
