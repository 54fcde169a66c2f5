"""The client cache tier against real daemons: local hits, the daemon's books and counters,
give-backs (ReturnCache, Trim, allowance 0), threads, and pressure from other processes."""
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import numpy
import pytest

import gpumemd
import gpumemd.aio
from gpumemd._stubs import pb

from conftest import HERE, run_java_peer

MiB = 1 << 20


def _until(predicate, what, seconds=10):
    """Polls ``predicate`` (bounded) for state the daemon reaches asynchronously (notices are batched)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail("not reached in %d s: %s" % (seconds, what))


def _session(daemon, session_id):
    for info in daemon.admin.ListSessions(pb.ListSessionsRequest()).sessions:
        if info.session_id == session_id:
            return info
    return None


def test_a_closed_lease_serves_the_next_one_locally_and_the_daemon_counts_it(daemon):
    before = daemon.stats(0)
    with gpumemd.connect(daemon.target, client_name="cache-hits") as gm:
        assert gm.stats().cache_allowance > 0  # the daemon's default allowance
        first = gm.lease(0, 4096)
        numpy.asarray(first)[:] = 7
        first.close()
        leases_before = gm.stats().leases
        again = gm.lease(0, 3000, tag="again")  # rounds to the same class: the cached block
        assert again.local_hit and again.id == first.id and again.size == 3000 and len(again.buffer()) == 3000
        assert gm.stats().leases == leases_before  # no round trip
        assert first.closed and not again.closed
        zeroed = gm.lease(0, 8192)  # a miss: from the daemon
        assert not zeroed.local_hit
        zeroed_id = zeroed.id
        numpy.asarray(zeroed)[:] = 9
        zeroed.close()
        zeroed = gm.lease(0, 8192, zero=True)  # a local hit, zeroed here: the whole block
        assert zeroed.local_hit and zeroed.id == zeroed_id
        assert not numpy.asarray(zeroed).any()
        zeroed.close()
        again.close()
        stats = gm.stats()
        assert stats.local_hits == 2 and stats.cached_leases == 2 and stats.cached_bytes == 4096 + 8192
        info = _until(lambda: (lambda i: i if i.client_cached_bytes == 4096 + 8192 and i.client_cache_hits == 2
                                else None)(_session(daemon, gm.session_id)), "the daemon's books of the cache")
        assert info.leases == 2 and info.client_cache_returns == 4
        _until(lambda: daemon.stats(0).client_cache_hits - before.client_cache_hits == 2, "GetStats client hits")
        session_id = gm.session_id
    assert _session(daemon, session_id) is None
    assert not [lease for lease in daemon.leases(device=0) if lease.lease_id in (first.id, zeroed_id)]


def test_allowance_zero_and_uncacheable_leases_are_released(daemon):
    with gpumemd.connect(daemon.target, client_name="cache-none", client_cache_bytes=0) as gm:
        assert gm.stats().cache_allowance == 0
        lease = gm.lease(0, 4096)
        lease.close()
        assert not gm.lease(0, 4096).local_hit
        _until(lambda: not [x for x in daemon.leases(device=0) if x.lease_id == lease.id], "the release")
    with gpumemd.connect(daemon.target, client_name="cache-shared", client_cache_bytes=8 * MiB) as gm:
        assert gm.stats().cache_allowance == 8 * MiB
        shared = gm.lease(0, 4096)
        shared.share().revoke()
        shared.close()
        published = gm.lease(0, 4096)
        gm.publish(published, "cache-test-%d" % os.getpid()).unpublish()
        published.close()
        big = gm.lease(0, 9 * MiB)  # over the whole allowance
        big.close()
        assert gm.stats().cached_leases == 0 and gm.stats().releases == 3
        assert not gm.lease(0, 4096).local_hit


def test_return_cache_and_a_smaller_allowance_take_the_memory_back(start_daemon):
    # Trim asks sessions for their client-cached blocks (ReturnCache) when the pool needs them.
    d = start_daemon("--client-cache-bytes", "16MiB")
    with gpumemd.connect(d.target, client_name="cache-trim") as gm:
        leases = [gm.lease(0, 2 * MiB) for _ in range(4)]
        for lease in leases:
            lease.close()
        assert gm.stats().cached_bytes == 8 * MiB
        _until(lambda: _session(d, gm.session_id).client_cached_bytes == 8 * MiB, "cached at the daemon")
        # A lease the pool cannot serve without the cached memory: the daemon asks for it back.
        budget = d.stats(0).limit_bytes
        other = gpumemd.connect(d.target, client_name="cache-pressure", client_cache_bytes=0)
        try:
            big = other.lease(0, budget - 4 * MiB, timeout=30)
            assert gm.stats().cached_bytes < 8 * MiB and gm.stats().releases >= 2
            big.close()
        finally:
            other.close()
        _until(lambda: _session(d, gm.session_id).client_cached_bytes == gm.stats().cached_bytes,
               "the daemon's books after the give-back")


def test_a_refused_cache_notice_is_released_and_the_books_agree(start_daemon):
    # A tier that believes in more allowance than the daemon holds it to (as after a lowered
    # allowance that has not arrived yet): the daemon refuses the notice past its 4 MiB
    # (ReleaseFailed, RESOURCE_EXHAUSTED) and keeps that lease in use; the tier releases it.
    d = start_daemon("--client-cache-bytes", "4MiB")
    with gpumemd.connect(d.target, client_name="cache-refused") as gm:
        assert gm.stats().cache_allowance == 4 * MiB
        gm._s.cache.allowance = 64 * MiB
        leases = [gm.lease(0, 2 * MiB) for _ in range(3)]
        for lease in leases:
            lease.close()  # the notices go in order: the third is past the daemon's allowance
        _until(lambda: gm.stats().release_failures == 1 and gm.stats().cached_bytes == 4 * MiB,
               "the refusal applied by the tier")
        assert gm.stats().cached_leases == 2 and gm.stats().releases == 1
        info = _until(lambda: (lambda i: i if i.leases == 2 else None)(_session(d, gm.session_id)),
                      "the refused lease released at the daemon")
        assert info.client_cached_bytes == 4 * MiB
        live = {lease.lease_id for lease in d.leases(device=0)}
        assert leases[2].id not in live and {leases[0].id, leases[1].id} <= live
        stats = d.stats(0)
        assert stats.client_cached_bytes == 4 * MiB and stats.leased_bytes == 0  # nothing left in use
        # The tier serves only what the daemon counts as cached.
        again = [gm.lease(0, 2 * MiB) for _ in range(3)]
        assert [lease.local_hit for lease in again] == [True, True, False]
        assert {lease.id for lease in again[:2]} == {leases[0].id, leases[1].id}
        for lease in again:
            lease.close()
        _until(lambda: gm.stats().release_failures == 2 and gm.stats().cached_bytes == 4 * MiB,
               "the second refusal applied")
        _until(lambda: (lambda i: i.leases == 2 and i.client_cached_bytes == 4 * MiB)(_session(d, gm.session_id)),
               "the daemon's books match the tier's")
        session_id = gm.session_id
    assert _session(d, session_id) is None and d.stats(0).client_cached_bytes == 0 and d.stats(0).leased_bytes == 0


class _Holder:
    """A cache_worker.py process: one lease of ``size`` closed into its client cache tier."""

    def __init__(self, target, size):
        self.process = subprocess.Popen([sys.executable, os.path.join(HERE, "cache_worker.py"), "cache", target, "0",
                                         str(size)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().split() == ["cached", str(size)]

    def stats(self):
        """(cached bytes, releases, allowance), as the holder's gm.stats() says."""
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return tuple(int(x) for x in self.process.stdout.readline().split())

    def end(self):
        self.process.stdin.close()
        assert self.process.wait(30) == 0


def _cached_at_daemon(d, nbytes):
    _until(lambda: any(i.client_cached_bytes == nbytes for i in d.admin.ListSessions(pb.ListSessionsRequest()).sessions),
           "%d bytes client-cached at the daemon" % nbytes)


@pytest.mark.parametrize("consumer", ["python", "java"])
def test_a_python_processs_cached_memory_reaches_another_process_that_needs_it(start_daemon, consumer):
    d = start_daemon("--client-cache-bytes", "128MiB", "--unmap-wait-ms", "5000")
    budget = d.stats(0).limit_bytes
    holder = _Holder(d.target, 64 * MiB)
    try:
        _cached_at_daemon(d, 64 * MiB)
        size = budget - 32 * MiB  # only with the holder's cached 64 MiB back, within --unmap-wait-ms
        if consumer == "python":
            with gpumemd.connect(d.target, client_name="cache-needs", client_cache_bytes=0) as gm:
                lease = gm.lease(0, size, timeout=30)
                assert lease.size == size
                lease.close()
        else:
            run_java_peer("write", d.target, 0, size, 3)  # leases, writes every byte, releases
        assert holder.stats() == (0, 1, 128 * MiB)
    finally:
        holder.end()


def test_a_python_client_that_does_not_answer_loses_its_allowance(start_daemon):
    d = start_daemon("--client-cache-bytes", "128MiB", "--unmap-wait-ms", "500")
    budget = d.stats(0).limit_bytes
    holder = _Holder(d.target, 64 * MiB)
    try:
        _cached_at_daemon(d, 64 * MiB)
        os.kill(holder.process.pid, signal.SIGSTOP)  # it cannot answer ReturnCache
        try:
            with gpumemd.connect(d.target, client_name="cache-needs", client_cache_bytes=0) as gm:
                with pytest.raises(gpumemd.GpumemdError) as refused:
                    gm.lease(0, budget - 32 * MiB, timeout=30)
                assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            os.kill(holder.process.pid, signal.SIGCONT)
        assert b"did not give back its client-cached blocks" in d._log_bytes()  # allowance withdrawn
        # Once running again it obeys what waited on its stream (ReturnCache, CacheAllowance 0):
        # everything back; then the daemon trusts it again and restores its allowance.
        _until(lambda: holder.stats() == (0, 1, 128 * MiB), "the give-back and the allowance restored")
        _cached_at_daemon(d, 0)
        with gpumemd.connect(d.target, client_name="cache-needs", client_cache_bytes=0) as gm:
            gm.lease(0, budget - 32 * MiB, timeout=30).close()
    finally:
        holder.end()


def test_threads_never_get_a_block_twice_and_the_books_balance(daemon):
    sizes = [512, 4096, 100_000, MiB, 3 * MiB]
    owners = {}
    errors = []
    lock = threading.Lock()
    with gpumemd.connect(daemon.target, client_name="cache-hammer", client_cache_bytes=16 * MiB) as gm:
        def hammer(seed):
            try:
                for i in range(300):
                    lease = gm.lease(seed % 2, sizes[(seed + i) % len(sizes)])
                    key = (lease.device, lease.segment_id, lease.offset)
                    with lock:
                        assert key not in owners, "block %s handed out twice" % (key,)
                        owners[key] = lease.id
                    view = lease.buffer()
                    view[0] = seed
                    view[-1] = seed
                    assert view[0] == seed and view[-1] == seed
                    with lock:
                        del owners[key]
                    lease.close()
            except Exception as e:  # reported below: an assertion in a thread does not fail the test
                errors.append(e)

        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        stats = gm.stats()
        assert stats.local_hits > 0 and stats.local_hits + stats.leases == 8 * 300
        session_id = gm.session_id
        # The books and the counters may arrive in different messages (each change schedules a
        # flush of what is pending then): wait for both.
        info = _until(lambda: (lambda i: i if i.client_cached_bytes == gm.stats().cached_bytes
                               and i.leases == gm.stats().cached_leases
                               and i.client_cache_hits == stats.local_hits else None)(_session(daemon, session_id)),
                      "the daemon's books and counters match the client's")
        assert info.client_cache_hits == stats.local_hits
    assert _session(daemon, session_id) is None
    for device in (0, 1):
        assert not [x for x in daemon.leases(device=device) if x.session_id == session_id]


def test_aio_serves_locally_and_gives_back_at_close(daemon):
    async def run():
        async with await gpumemd.aio.connect(daemon.target, client_name="cache-aio",
                                             client_cache_bytes=8 * MiB) as gm:
            lease = await gm.lease(0, 65536)
            await lease.aclose()
            again = await gm.lease(0, 65536, zero=True)
            assert again.local_hit and again.id == lease.id and not numpy.asarray(again).any()
            again.close()
            info = None
            for _ in range(500):
                info = _session(daemon, gm.session_id)
                if info.client_cache_hits == 1 and info.client_cached_bytes == 65536:
                    break
                await asyncio.sleep(0.02)
            assert info.client_cache_hits == 1 and info.client_cached_bytes == 65536
            assert gm.stats().local_hits == 1
            return lease.id

    lease_id = asyncio.run(run())
    assert not [x for x in daemon.leases(device=0) if x.lease_id == lease_id]


def test_a_negative_allowance_is_refused():
    with pytest.raises(ValueError):
        gpumemd.connect("unix:///nowhere", client_cache_bytes=-1)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(port, name, device):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    for match in re.finditer(r'^%s\w*\{[^}]*device="%d"[^}]*\} (\S+)$' % (name, device), text, re.M):
        return float(match.group(1))
    return None


def test_the_daemons_metrics_show_the_python_tier(start_daemon):
    port = _free_port()
    d = start_daemon("--metrics-port", str(port))
    with gpumemd.connect(d.target, client_name="cache-metrics") as gm:
        for _ in range(3):
            gm.lease(0, 4096).close()
        assert gm.stats().local_hits == 2
        _until(lambda: _metric(port, "gpumemd_client_cache_hits", 0) == 2, "gpumemd_client_cache_hits 2 on /metrics")
        assert _metric(port, "gpumemd_client_cache_returns", 0) == 3
