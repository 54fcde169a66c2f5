"""CUDA VMM mappings in address ranges kept from mapping to close (issue 35 item 1): vacated
(cuMemUnmap, cuMemRelease; the range stays reserved) and refilled (a newly imported allocation
cuMemMap'd at the same address, cuMemSetAccess again), the same segment or another of its size.
Runs on a GPU or on the stand-in driver (cuda-standin/), which implements VMM strictly: a copy
from a range with nothing mapped fails there."""
import pytest

import gpumemd
from gpumemd import _cuda
from gpumemd._errors import GpumemdError
from gpumemd._mapping import VmmMapping
from test_cuda import raw_lease, vmm_daemon  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif(not gpumemd.cuda_available(),
                                reason="no usable CUDA device (libcuda.so.1 missing or no GPU reported)")

SIZE = 4 << 20


def _descriptor(gm, handle, read_only=False):
    return gm._fd_channels.fetch(gm._s.id, handle, read_only)


def _mapping(gm, device, handle, read_only=False):
    return VmmMapping(device, handle.segment_id, _descriptor(gm, handle, read_only).take(), handle.segment_bytes,
                      read_only)


def _refill(gm, mapping, handle, read_only=False):
    descriptor = _descriptor(gm, handle, read_only)
    try:
        mapping.refill(descriptor.fd)
    finally:
        descriptor.close()


def test_a_vmm_mapping_keeps_its_address_through_vacate_and_refill(vmm_daemon):  # noqa: F811
    with gpumemd.connect(vmm_daemon.target, client_cache_bytes=0) as gm:
        first, second = raw_lease(gm, SIZE), raw_lease(gm, SIZE)
        assert first.handle.segment_id != second.handle.segment_id
        assert first.handle.segment_bytes == second.handle.segment_bytes
        device = _cuda.local_device(0, gm._s.device_uuid(0))
        mapping = _mapping(gm, device, first.handle)
        try:
            base = mapping.base
            at = base + first.handle.offset
            _cuda.copy_to_device(device, at, b"first")

            mapping.vacate()
            assert mapping.vacated and mapping.base == base
            with pytest.raises(GpumemdError):
                _cuda.copy_from_device(device, at, 5)  # nothing mapped there: the driver refuses
            mapping.vacate()  # twice: nothing
            assert mapping.vacated

            _refill(gm, mapping, first.handle)
            assert mapping.base == base and _cuda.copy_from_device(device, at, 5) == b"first"

            mapping.vacate()
            _refill(gm, mapping, second.handle)  # another allocation of the same size, same address
            at2 = base + second.handle.offset
            _cuda.copy_to_device(device, at2, b"second")
            mapping.vacate()
            _refill(gm, mapping, first.handle)
            assert _cuda.copy_from_device(device, at, 5) == b"first"
            mapping.vacate()
            _refill(gm, mapping, second.handle)
            assert _cuda.copy_from_device(device, at2, 6) == b"second"
            with pytest.raises(ValueError):
                mapping.refill(0)  # mapped: the driver maps only into an empty range
        finally:
            mapping.try_close()
            gm._give_back(gm._s, first.lease_id)
            gm._give_back(gm._s, second.lease_id)


def test_close_after_vacate_frees_the_range_and_read_only_stays_read_only(vmm_daemon, caplog):  # noqa: F811
    with gpumemd.connect(vmm_daemon.target, client_cache_bytes=0) as gm:
        lease = raw_lease(gm, SIZE)
        device = _cuda.local_device(0, gm._s.device_uuid(0))
        try:
            vacated = _mapping(gm, device, lease.handle)
            vacated.vacate()
            assert vacated.try_close()
            # cuMemAddressFree only (nothing mapped, nothing to release): any failed call is logged
            assert not [r for r in caplog.records if r.name == "gpumemd"], caplog.text
            with pytest.raises(ValueError):
                vacated.vacate()

            read_only = _mapping(gm, device, lease.handle, read_only=True)
            read_only.vacate()
            _refill(gm, read_only, lease.handle, read_only=True)
            at = read_only.base + lease.handle.offset
            assert _cuda.copy_from_device(device, at, 4) is not None
            with pytest.raises(GpumemdError):
                _cuda.copy_to_device(device, at, b"nope")  # the driver enforces the access set
            read_only.try_close()
        finally:
            gm._give_back(gm._s, lease.lease_id)
