"""Host mappings in reserved address ranges (issue 35 item 1): a segment's mapping can be
vacated and refilled at the same address, the same segment or another of its size, with every
memoryview and array made from it still valid. Real daemon segments (``--host-segments path``:
their files are what the mappings are refilled from); the fault of a vacated range is shown in
a child process."""
import os
import signal
import subprocess
import sys

import numpy
import pytest

import gpumemd
from gpumemd._errors import GpumemdError
from gpumemd._mapping import HostMapping

SIZE = 4 << 20  # a large request: a segment of its own


def _range_at(address):
    """The /proc/self/maps fields of the mapping that holds ``address``, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return [x.strip() for x in fields]
    return None


def _file_at(address):
    fields = _range_at(address)
    assert fields is not None and len(fields) == 6 and fields[5].startswith("/"), fields
    return fields[5]


@pytest.fixture
def two_segments(start_daemon):
    d = start_daemon("--host-segments", "path")
    with gpumemd.connect(d.target, client_cache_bytes=0) as gm:
        first, second = gm.lease(0, SIZE), gm.lease(0, SIZE)
        assert first.segment_id != second.segment_id
        first.buffer()[:] = b"\x11" * SIZE
        second.buffer()[:] = b"\x22" * SIZE
        yield first, second
        first.close()
        second.close()


def test_a_lease_keeps_its_address_and_bytes_through_vacate_and_refill(two_segments):
    first, second = two_segments
    mapping = first._mapping
    view = first.buffer()
    array = numpy.asarray(first)
    address = array.ctypes.data
    assert address == mapping.address + first.offset
    first_file, second_file = _file_at(mapping.address), _file_at(second._mapping.address)

    mapping.vacate()
    assert _range_at(mapping.address)[1] == "---p"  # the inaccessible reservation
    assert first_file not in open("/proc/self/maps").read()

    mapping.refill(path=first_file)
    assert numpy.asarray(first).ctypes.data == address
    assert (view[0], view[SIZE - 1], int(array[7])) == (0x11, 0x11, 0x11)

    mapping.refill(path=second_file)  # another segment of the same size, at the same address
    assert (view[0], int(array[1])) == (0x22, 0x22)
    array[1] = 0x33
    assert second.buffer()[1] == 0x33  # shared: written through the refilled range
    second.buffer()[1] = 0x22

    mapping.vacate()
    mapping.refill(path=first_file)  # as it was, for the client's own close
    assert view[1] == 0x11 and numpy.asarray(first).ctypes.data == address
    del array, view


def test_refill_from_a_descriptor(two_segments):
    first, _ = two_segments
    path = _file_at(first._mapping.address)
    mapping = HostMapping(0, path, SIZE)
    try:
        view = mapping.view(0, 16)
        mapping.vacate()
        fd = os.open(path, os.O_RDWR)
        try:
            mapping.refill(fd=fd)
        finally:
            os.close(fd)
        assert view[0] == 0x11 and not mapping.vacated
        del view
    finally:
        assert mapping.try_close()


def test_close_after_vacate_leaves_nothing_mapped(two_segments):
    first, _ = two_segments
    path = _file_at(first._mapping.address)
    mapping = HostMapping(0, path, SIZE)
    address = mapping.address
    assert _file_at(address) == path
    view = mapping.view(0, 8)
    mapping.vacate()
    assert not mapping.try_close()  # a view is alive: refused, as an exported mmap refuses
    del view
    assert mapping.try_close()
    assert _range_at(address) is None
    with pytest.raises(ValueError):
        mapping.refill(path=path)


def test_a_read_only_mapping_stays_read_only_after_refill(two_segments):
    first, _ = two_segments
    path = _file_at(first._mapping.address)
    mapping = HostMapping(0, path, SIZE, read_only=True)
    try:
        view = mapping.view(0, 16)
        mapping.vacate()
        mapping.refill(path=path)
        assert _range_at(mapping.address)[1] == "r--s"
        assert view.readonly and view[0] == 0x11
        with pytest.raises(TypeError):
            view[0] = 1
        del view
    finally:
        assert mapping.try_close()


def test_a_segment_of_another_size_is_refused_and_changes_nothing(two_segments, tmp_path):
    first, _ = two_segments
    path = _file_at(first._mapping.address)
    small = tmp_path / "small"
    small.write_bytes(bytes(4096))
    mapping = HostMapping(0, path, SIZE)
    try:
        mapping.vacate()
        with pytest.raises(GpumemdError, match="4096 bytes"):
            mapping.refill(path=str(small))
        assert _range_at(mapping.address)[1] == "---p" and mapping.vacated
        mapping.refill(path=path)
        assert mapping.view(0, 1)[0] == 0x11
    finally:
        assert mapping.try_close()


CHILD = """
import sys, gpumemd
with gpumemd.connect(sys.argv[1]) as gm:
    lease = gm.lease(0, 1 << 20)
    view = lease.buffer()
    view[0] = 7
    print("read", view[0], flush=True)
    lease._mapping.vacate()
    print("vacated", flush=True)
    print("read after vacate", view[0], flush=True)  # faults: never printed
"""


@pytest.mark.parametrize("segments", ["fd", "path"])
def test_touching_a_vacated_range_faults(start_daemon, segments):
    d = start_daemon("--host-segments", segments)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", CHILD, d.target], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.stdout.splitlines() == ["read 7", "vacated"], result.stdout + result.stderr
    assert result.returncode == -signal.SIGSEGV, result.stderr
