"""The framework allocators' core without PyTorch, CuPy or a GPU: the C shim built with the system
compiler, its entry points called through ctypes as PyTorch calls them (the alloc entry point
takes the GIL in a ctypes callback, the free entry point queues), the pointer-to-lease table,
refusals with the daemon's words, quotas and the budget, and a killed process's allocations,
against real daemons on the host backend (a host lease's pointer is its block's address in this
process, so bytes written through it are read back through the lease)."""
import ctypes
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

import gpumemd
from conftest import HERE
from gpumemd import _alloc, _shim

MiB = 1 << 20


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """The process's free queue with its background thread paused (tests watch frees wait in
    the queue; the background test resumes it). The shim is built into a fresh directory unless
    another module of this run loaded it first. Without a C compiler these tests skip (a build
    that fails with one is a failure)."""
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        pytest.skip("no C compiler (%s) to build the allocator shim" % compiler)
    if _shim._shim is None:
        os.environ["GPUMEMD_SHIM_DIR"] = str(tmp_path_factory.mktemp("shim"))
    queue = _alloc.free_queue()
    queue.pause_background()
    yield queue
    queue.resume_background()


class Entry:
    """A slot's two entry points, called through ctypes as PyTorch calls them."""

    def __init__(self, allocator, queue):
        self.allocator = allocator
        path, alloc_name, free_name = _alloc.bind(allocator, queue)
        library = ctypes.CDLL(path)
        self.path = path
        self.alloc = getattr(library, alloc_name)
        self.alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.alloc.restype = ctypes.c_void_p
        self.free = getattr(library, free_name)
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.free.restype = None


def session_leases(daemon, gm):
    return daemon.leases(session_id=gm.session_id)


def wait_until(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s not reached within %.0f s" % (what, timeout)
        time.sleep(0.01)


def test_shim_is_cached_by_source_and_exports_every_slot(queue):
    assert os.path.dirname(queue.shim.path) == _shim.cache_dir()
    assert _shim.build() == queue.shim.path  # built once, found again
    assert queue.shim.slots == 64
    library = ctypes.CDLL(queue.shim.path)
    for n in range(queue.shim.slots):
        assert getattr(library, "gpumemd_alloc_%d" % n) and getattr(library, "gpumemd_free_%d" % n)


def test_alloc_entry_leases_and_its_pointer_reaches_the_block(daemon, queue):
    with gpumemd.connect(daemon.target) as gm:
        entry = Entry(_alloc.LeaseAllocator(gm, 0, tag="alloc-test"), queue)
        size = 3 * MiB + 512
        pointer = entry.alloc(size, 0, None)
        assert pointer
        [listed] = session_leases(daemon, gm)
        assert listed.tag == "alloc-test" and listed.size_bytes == size
        lease = entry.allocator.lease_of(pointer)
        assert lease.id == listed.lease_id
        pattern = bytes(random.Random(7).getrandbits(8) for _ in range(4096))
        ctypes.memmove(pointer + size - 4096, pattern, 4096)  # through the pointer PyTorch would get
        assert bytes(lease.buffer()[size - 4096:]) == pattern  # read through the lease's own mapping
        assert entry.allocator.stats()._replace(peak_bytes=0) == (1, 0, 0, 0, 1, size, 0)

        entry.free(pointer, size, 0, None)  # queued, returns at once: no Python, no GIL
        assert queue.shim.pending_frees() == 1
        assert [e.lease_id for e in session_leases(daemon, gm)] == [listed.lease_id]
        assert queue.drain(10) and lease.closed
        # A release on the stream is a notice nobody waits for: the daemon applies it shortly.
        wait_until(lambda: session_leases(daemon, gm) == [], "the release on the daemon")
        assert entry.allocator.stats() == (1, 1, 0, 0, 0, 0, size)
        assert entry.allocator.lease_of(pointer) is None


def test_lease_of_finds_the_lease_under_any_byte_of_it(daemon, queue):
    with gpumemd.connect(daemon.target) as gm:
        allocator = _alloc.LeaseAllocator(gm, 0)
        entry = Entry(allocator, queue)
        sizes = [MiB, 5 * MiB, 2048, 7 * MiB + 512]
        pointers = [entry.alloc(size, 0, None) for size in sizes]
        assert all(pointers) and len(set(pointers)) == len(sizes)
        for pointer, size in zip(pointers, sizes):
            lease = allocator.lease_of(pointer)
            assert lease.size == size and _alloc.pointer_of(lease) == pointer
            assert allocator.lease_of(pointer + size - 1) is lease
            after = allocator.lease_of(pointer + size)
            assert after is not lease  # the byte after it is another lease's or none
        assert allocator.lease_of(min(pointers) - 1) is None
        assert sorted(allocator.leases(), key=lambda lease: lease.id) == sorted(
            (allocator.lease_of(p) for p in pointers), key=lambda lease: lease.id)
        for pointer, size in zip(pointers, sizes):
            entry.free(pointer, size, 0, None)
        assert queue.drain(10) and allocator.leases() == []
        wait_until(lambda: session_leases(daemon, gm) == [], "the releases on the daemon")


def test_refusal_returns_null_and_keeps_the_daemons_words(start_daemon, queue, caplog):
    d = start_daemon("--quota-max-leases", "2")
    with gpumemd.connect(d.target) as gm:
        allocator = _alloc.LeaseAllocator(gm, 0, tag="quota-test")
        entry = Entry(allocator, queue)
        assert entry.alloc(MiB, 0, None) and entry.alloc(MiB, 0, None)
        with caplog.at_level("WARNING", logger="gpumemd"):
            assert not entry.alloc(MiB, 0, None)  # NULL: PyTorch raises its OutOfMemoryError
        error = allocator.last_error
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "quota" in error.message.lower()  # the daemon's words, not ours
        assert error.message in caplog.text  # logged once, as a warning
        assert allocator.stats().failures == 1 and allocator.stats().live_leases == 2
        assert len(session_leases(d, gm)) == 2  # the refusal changed nothing


def test_budget_counts_allocations_and_an_allocation_first_releases_queued_frees(start_daemon, queue):
    """PyTorch, refused, frees its cached segments and allocates again: the retry must find that
    memory back with the daemon, though no thread has taken the queued frees yet."""
    d = start_daemon("--device-limit-bytes", "32MiB")
    with gpumemd.connect(d.target) as gm:
        allocator = _alloc.LeaseAllocator(gm, 1)
        entry = Entry(allocator, queue)
        size = 12 * MiB
        first, second = entry.alloc(size, 1, None), entry.alloc(size, 1, None)
        assert first and second
        assert d.stats(1).leased_bytes == 2 * size  # ordinary leases on the daemon's books
        assert not entry.alloc(size, 1, None)
        assert allocator.last_error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "32" in allocator.last_error.message or "limit" in allocator.last_error.message.lower()
        ooms = d.stats(1).ooms
        assert ooms >= 1

        entry.free(first, size, 1, None)
        assert queue.shim.pending_frees() == 1  # the background thread is paused
        third = entry.alloc(size, 1, None)
        assert third, allocator.last_error
        assert queue.shim.pending_frees() == 0
        wait_until(lambda: d.stats(1).leased_bytes == 2 * size, "the daemon's books")
        assert d.stats(1).ooms == ooms
        for pointer in (second, third):
            entry.free(pointer, size, 1, None)
        assert queue.drain(10)
        wait_until(lambda: d.stats(1).leased_bytes == 0, "the releases on the daemon")


def test_free_of_an_unknown_pointer_is_counted_and_releases_nothing(daemon, queue, caplog):
    with gpumemd.connect(daemon.target) as gm:
        allocator = _alloc.LeaseAllocator(gm, 0)
        entry = Entry(allocator, queue)
        pointer = entry.alloc(MiB, 0, None)
        with caplog.at_level("WARNING", logger="gpumemd"):
            entry.free(pointer + 512, MiB, 0, None)  # inside the lease, but not its start
            assert queue.drain(10)
        assert "did not allocate" in caplog.text
        assert allocator.stats().unknown_frees == 1 and len(session_leases(daemon, gm)) == 1
        entry.free(pointer, MiB, 0, None)
        assert queue.drain(10)
        wait_until(lambda: session_leases(daemon, gm) == [], "the release on the daemon")


def test_a_closed_client_refuses_without_crossing_the_c_frames(daemon, queue):
    gm = gpumemd.connect(daemon.target)
    allocator = _alloc.LeaseAllocator(gm, 0)
    entry = Entry(allocator, queue)
    gm.close()
    assert not entry.alloc(MiB, 0, None)
    assert isinstance(allocator.last_error, gpumemd.GpumemdError)
    assert allocator.stats().failures == 1


def test_threads_allocating_and_freeing_at_once_keep_the_books(daemon, queue):
    with gpumemd.connect(daemon.target) as gm:
        allocator = _alloc.LeaseAllocator(gm, 0)
        entry = Entry(allocator, queue)
        live = {}
        lock = threading.Lock()
        problems = []

        def work(seed):
            rng = random.Random(seed)
            mine = []
            for _ in range(60):
                if mine and rng.random() < 0.45:
                    pointer, size = mine.pop(rng.randrange(len(mine)))
                    with lock:
                        del live[pointer]
                    entry.free(pointer, size, 0, None)
                    continue
                size = rng.choice([4096, 512 * 1024, 3 * MiB])
                pointer = entry.alloc(size, 0, None)
                if not pointer:
                    problems.append("refused: %s" % allocator.last_error)
                    continue
                with lock:
                    if pointer in live:
                        problems.append("0x%x handed out twice" % pointer)
                    live[pointer] = size
                ctypes.memset(pointer, seed, size)
                mine.append((pointer, size))
            for pointer, size in mine:
                if ctypes.string_at(pointer, 1)[0] != seed or ctypes.string_at(pointer + size - 1, 1)[0] != seed:
                    problems.append("0x%x overwritten" % pointer)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert problems == []
        assert queue.drain(10)
        stats = allocator.stats()
        assert stats.live_leases == len(live) and stats.live_bytes == sum(live.values())
        assert stats.allocations - stats.frees == len(live)
        wait_until(lambda: sorted(e.size_bytes for e in session_leases(daemon, gm)) == sorted(live.values()),
                   "the daemon's books equal to the allocator's")
        for pointer, size in live.items():
            entry.free(pointer, size, 0, None)
        assert queue.drain(10)
        wait_until(lambda: session_leases(daemon, gm) == [], "the releases on the daemon")


def test_a_killed_process_allocations_come_back(daemon, queue):
    before = {e.lease_id for e in daemon.leases()}
    worker = subprocess.Popen([sys.executable, os.path.join(HERE, "alloc_worker.py"), daemon.target, "0", str(4 * MiB), "3"],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        line = worker.stdout.readline().split()
        assert line and line[0] == "ready", line
        session = line[1]
        assert len([e for e in daemon.leases(session_id=session) if e.tag == "alloc-worker"]) == 3
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    wait_until(lambda: daemon.leases(session_id=session) == [], "the killed worker's leases back")
    assert {e.lease_id for e in daemon.leases()} <= before


def test_no_compiler_fails_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(_shim.ShimUnavailable) as raised:  # gpumemd.torch falls back on this one
        _shim.build(str(tmp_path / "shim.so"))
    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "C compiler" in raised.value.message and "no-such-cc" in raised.value.message
    assert not os.path.exists(tmp_path / "shim.so")
    assert isinstance(raised.value, gpumemd.GpumemdError)


def test_a_failing_build_fails_with_the_compilers_words(tmp_path, monkeypatch):
    compiler = tmp_path / "cc"
    compiler.write_text("#!/bin/sh\necho 'cc: fatal error: out of disk' >&2\nexit 4\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    with pytest.raises(_shim.ShimUnavailable) as raised:
        _shim.build(str(tmp_path / "shim.so"))
    assert "exit 4" in raised.value.message and "out of disk" in raised.value.message
    assert not os.path.exists(tmp_path / "shim.so") and os.listdir(tmp_path) == ["cc"]  # no temporary left


def test_background_thread_releases_without_a_drain(daemon, queue):
    with gpumemd.connect(daemon.target) as gm:
        allocator = _alloc.LeaseAllocator(gm, 0)
        entry = Entry(allocator, queue)
        pointer = entry.alloc(2 * MiB, 0, None)
        assert len(session_leases(daemon, gm)) == 1
        queue.resume_background()
        entry.free(pointer, 2 * MiB, 0, None)
        wait_until(lambda: session_leases(daemon, gm) == [], "the release by the background thread")
        assert allocator.stats().frees == 1


def test_garbage_collection_is_paused_while_an_allocation_leases(daemon, queue):
    import gc

    seen = []
    with gpumemd.connect(daemon.target) as gm:
        allocator = _alloc.LeaseAllocator(gm, 0)
        real = gm.lease

        def lease(*args, **kwargs):  # the client's own lease, observed from inside the callback
            seen.append(gc.isenabled())
            return real(*args, **kwargs)

        gm.lease = lease
        entry = Entry(allocator, queue)
        assert gc.isenabled()
        pointer = entry.alloc(MiB, 0, None)
        assert pointer and seen == [False] and gc.isenabled()
        with _alloc.gc_paused():
            with _alloc.gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
        entry.free(pointer, MiB, 0, None)
        assert queue.drain(10)
