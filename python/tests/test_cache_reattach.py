"""The client cache tier across a broken KeepAlive stream, with a real daemon: the connection is
broken by killing a proxy process (stream_proxy.py) between client and daemon, and the client
reattaches within the daemon's keepalive grace. The tier's notices that were pending meanwhile
(closes into the cache, local reuses, evictions' releases) reach the daemon once, in order."""
import os
import subprocess
import sys
import time

import pytest

import gpumemd
from gpumemd._stubs import pb

from conftest import HERE

KiB = 1 << 10
BLOCK = 64 * KiB


class _Proxy:
    """stream_proxy.py in its own process, listening on ``path`` for the daemon at ``target``."""

    def __init__(self, path, target):
        self.process = subprocess.Popen([sys.executable, os.path.join(HERE, "stream_proxy.py"), path, target],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def kill(self):
        self.process.kill()  # SIGKILL: every connection through it closes at once
        self.process.wait(30)
        self.process.stdout.close()


def _until(predicate, what, seconds=30, state=lambda: ""):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail("not reached in %d s: %s %s" % (seconds, what, state()))


def _session(d, session_id):
    for info in d.admin.ListSessions(pb.ListSessionsRequest()).sessions:
        if info.session_id == session_id:
            return info
    return None


def _books_agree(d, gm, open_leases, returns):
    """The daemon's books of the session are the client's: its leases (cached and open), cached
    bytes and the tier's counters."""
    info = _session(d, gm.session_id)
    cached = {lease.id for lease in gm._s.cache._by_age.values()}
    stats = gm.stats()
    live = {lease.lease_id for lease in d.leases(device=0) if lease.session_id == gm.session_id}
    return (info is not None and info.stream_attached and live == cached | {lease.id for lease in open_leases}
            and info.client_cached_bytes == stats.cached_bytes == len(cached) * BLOCK
            and info.client_cache_hits == stats.local_hits and info.client_cache_returns == returns)


def _state(d, gm):
    info = _session(d, gm.session_id)
    cached = {lease.id for lease in gm._s.cache._by_age.values()}
    live = {lease.lease_id for lease in d.leases(device=0) if lease.session_id == gm.session_id}
    return "(daemon: %s; client: %s; only at the daemon: %s; only cached: %s)" % (
        info, gm.stats(), live - cached, cached - live)


def _break(proxy, gm):
    """Kills the proxy and waits until the client has seen its stream break."""
    call = gm._s.call
    proxy.kill()
    _until(lambda: gm._s.call is not call, "the client saw its KeepAlive stream break")


def test_notices_pending_while_the_stream_is_broken_arrive_once(start_daemon, tmp_path):
    d = start_daemon("--keepalive-grace-ms", "60000", "--client-cache-bytes", str(8 * BLOCK))
    path = str(tmp_path / "proxy.sock")
    proxy = _Proxy(path, d.socket)
    gm = gpumemd.connect("unix://" + path, client_name="cache-reattach")
    try:
        held = [gm.lease(0, BLOCK) for _ in range(10)]
        for lease in held[:6]:
            lease.close()
        _until(lambda: _books_agree(d, gm, held[6:], 6), "the books before the break", state=lambda: _state(d, gm))

        _break(proxy, gm)
        reused = [gm.lease(0, BLOCK) for _ in range(2)]  # local hits: reuse notices
        assert all(lease.local_hit for lease in reused)
        for lease in held[6:]:
            lease.close()  # closes into the cache: 8 blocks, the allowance
        for lease in reused:
            lease.close()  # each evicts the least recently cached: a release before its notice
        stats = gm.stats()
        assert stats.cached_leases == 8 and stats.releases == 2 and stats.local_hits == 2
        proxy = _Proxy(path, d.socket)
        _until(lambda: _books_agree(d, gm, [], 12), "the books after the reattach", state=lambda: _state(d, gm))

        # A break the client has not seen yet when the tier moves leases (any interleaving).
        again = [gm.lease(0, BLOCK) for _ in range(3)]
        call = gm._s.call
        proxy.kill()
        for lease in again:
            lease.close()
        _until(lambda: gm._s.call is not call, "the client saw its KeepAlive stream break")
        proxy = _Proxy(path, d.socket)
        _until(lambda: _books_agree(d, gm, [], 15), "the books after the second reattach",
               state=lambda: _state(d, gm))
        assert gm.stats().release_failures == 0  # nothing doubled: the daemon refused no notice
        assert gm.session_generation == 1  # reattached, never lost
        session_id = gm.session_id
    finally:
        gm.close()
        proxy.kill()
    assert _session(d, session_id) is None
    stats = d.stats(0)
    assert stats.leased_bytes == 0 and stats.client_cached_bytes == 0 and stats.active_leases == 0
