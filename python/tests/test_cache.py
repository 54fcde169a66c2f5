"""Unit tests of gpumemd._cache, the client cache tier's bookkeeping (no daemon): best fit by
the daemon's size classes, the allowance, give-backs, and the notices it sends."""
import collections

from gpumemd._cache import ClientCache, SizeRules
from gpumemd._stubs import pb

MiB = 1 << 20
_Lease = collections.namedtuple("_Lease", "id device block_bytes")


def _cache(allowance=64 * MiB, max_oversize=20 * MiB, rules=None):
    wakes = []
    return ClientCache(allowance, rules or SizeRules(max_oversize=max_oversize), wakes.append), wakes


def _sent(cache, room=8192):
    message = pb.KeepAliveRequest()
    more = cache.fill(message, room)
    return ([(n.lease_id, n.reused) for n in message.cache_notices], [r.lease_id for r in message.releases],
            {c.device: (c.hits, c.returns) for c in message.client_counters}, more)


def test_default_size_rules_are_an_older_daemons():
    rules = SizeRules()
    assert rules.round_up(1) == 512 and rules.round_up(512) == 512 and rules.round_up(513) == 1024
    assert rules.largest_fit(512) == 2 * MiB and rules.largest_fit(MiB) == 2 * MiB  # small: one small segment
    assert rules.largest_fit(MiB + 512) == 21 * MiB + 512  # large: the oversize rule


def test_the_tier_follows_the_rules_the_daemon_states():
    """Rules other than the defaults (as a daemon with other size classes would state them)
    change the rounding and the fit: nothing of the table is a copy here."""
    rules = SizeRules.of(pb.OpenSessionResponse(
        size_classes=pb.SizeClassRules(alignment_bytes=4096, small_max_bytes=256 << 10, small_segment_bytes=MiB),
        max_oversize_bytes=0))
    assert (rules.alignment, rules.small_max, rules.small_segment, rules.max_oversize) == (4096, 256 << 10, MiB, 0)
    cache, _ = _cache(allowance=1 << 40, rules=rules)
    for lease in (_Lease("4k", 0, 4096), _Lease("1m", 0, MiB), _Lease("300k", 0, 300 << 10)):
        assert cache.offer(lease) == ()
    assert cache.take(0, 100).id == "4k"            # rounded to 4096, not 512
    assert cache.take(0, 257 << 10) is None         # a large request now: only exact fits (oversize 0)
    assert cache.take(0, 300 << 10).id == "300k"
    assert cache.take(0, 200 << 10).id == "1m"      # small: up to the 1 MiB small segment
    older = SizeRules.of(pb.OpenSessionResponse())  # a daemon that states nothing
    assert (older.alignment, older.small_max, older.small_segment, older.max_oversize) == (512, MiB, 2 * MiB,
                                                                                           20 * MiB)


def test_the_daemon_states_its_size_classes_and_the_session_uses_them(daemon):
    import gpumemd

    with gpumemd.connect(daemon.target) as gm:
        rules = gm._s.cache.rules
        assert (rules.alignment, rules.small_max, rules.small_segment) == (512, MiB, 2 * MiB)  # SizeClasses
        assert rules.max_oversize == 20 * MiB  # --max-oversize-bytes' default


def test_best_fit_within_the_size_classes_and_the_oversize_rule():
    cache, _ = _cache(allowance=1 << 40, max_oversize=4 * MiB)
    for lease in (_Lease("small", 0, 4096), _Lease("seg", 0, 2 * MiB), _Lease("big", 0, 64 * MiB),
                  _Lease("other-device", 1, 4096)):
        assert cache.offer(lease) == ()
    assert cache.take(0, 8192).id == "seg"         # small request: the smallest block >= it, within 2 MiB
    assert cache.take(0, 5000) is None             # only the 64 MiB block is left >= 5000: not for a small one
    assert cache.take(0, 59 * MiB) is None         # 64 MiB is more than 4 MiB over 59 MiB
    assert cache.take(0, 60 * MiB).id == "big"
    assert cache.take(0, 4000).id == "small"       # rounded to 4096: exact fit
    assert cache.take(1, 100).id == "other-device" and len(cache) == 0 and cache.cached_bytes == 0
    assert cache.local_hits == 4


def test_offer_evicts_least_recently_cached_and_sends_their_releases_before_the_newcomer():
    cache, wakes = _cache(allowance=10 * MiB)
    for i in range(3):
        cache.offer(_Lease("l%d" % i, 0, 4 * MiB))  # the third does not fit: l0 goes
    assert cache.cached_bytes == 8 * MiB and wakes == [False]  # one wake for the batch
    notices, releases, counters, more = _sent(cache, room=1)
    assert releases == ["l0"] and notices == [] and more  # no room for the rest: more at once
    notices, releases, counters, more = _sent(cache)
    assert notices == [("l1", False), ("l2", False)] and counters == {0: (0, 3)} and not more
    assert cache.offer(_Lease("huge", 0, 11 * MiB)) is None  # larger than the whole allowance


def test_a_close_and_a_reuse_cancel_out_and_a_release_supersedes_a_cache_notice():
    cache, _ = _cache()
    lease = _Lease("a", 0, 4096)
    cache.offer(lease)
    assert cache.take(0, 4096) is lease
    cache.offer(lease)
    cache.take(0, 4096)
    notices, releases, counters, _ = _sent(cache)
    assert notices == [] and releases == [] and counters == {0: (2, 2)}  # only the counters
    assert _sent(cache)[2] == {}  # unchanged counters are not sent again
    cache.offer(lease)
    cache.release("b")
    assert cache.give_back(0, 0) == [lease]
    notices, releases, _, _ = _sent(cache)
    assert notices == [] and releases == ["b", "a"]


def test_return_cache_allowance_and_drain():
    cache, wakes = _cache(allowance=64 * MiB)
    leases = [_Lease("d0-%d" % i, 0, 2 * MiB) for i in range(4)] + [_Lease("d1", 1, 2 * MiB)]
    for lease in leases:
        cache.offer(lease)
    wakes.clear()
    assert [lease.id for lease in cache.give_back(0, 3 * MiB)] == ["d0-0", "d0-1"]  # at least 3 MiB, oldest first
    assert wakes == [True]  # the daemon asked: sent at once
    assert [lease.id for lease in cache.set_allowance(2 * MiB)] == ["d0-2", "d0-3"]  # d1 fits 2 MiB
    assert [lease.id for lease in cache.set_allowance(0)] == ["d1"] and cache.cached_bytes == 0
    assert cache.offer(_Lease("x", 0, 512)) is None  # allowance 0: nothing is kept
    cache.set_allowance(64 * MiB)
    cache.offer(_Lease("y", 0, 512))
    assert [lease.id for lease in cache.drain(discard=False)] == ["y"]
    assert cache.offer(_Lease("z", 0, 512)) is None and cache.take(0, 512) is None  # drained for good
    notices, releases, _, _ = _sent(cache)
    assert releases == ["d0-0", "d0-1", "d0-2", "d0-3", "d1"] and notices == [("y", False)]
    cache.release("late")
    cache.drain(discard=True)  # the session is lost: nothing more is sent
    cache.release("after")
    assert _sent(cache)[:2] == ([], [])


def test_a_refused_cache_notice_takes_the_lease_out_and_releases_it():
    cache, wakes = _cache()
    kept, refused = _Lease("kept", 0, 4096), _Lease("refused", 0, 2 * MiB)
    cache.offer(kept)
    cache.offer(refused)
    _sent(cache)  # both notices went out; the daemon refuses the second one
    assert cache.refused("refused") is refused
    assert len(cache) == 1 and cache.cached_bytes == 4096 and cache.take(0, 2 * MiB) is None
    notices, releases, _, _ = _sent(cache)
    assert releases == ["refused"] and notices == []
    assert cache.take(0, 4096) is kept
    assert cache.refused("kept") is None  # handed out again meanwhile: in use at both ends
    assert cache.refused("unknown") is None and wakes.count(False) >= 2


def test_an_attach_flushes_what_queued_up_while_the_stream_was_away():
    cache, wakes = _cache()
    a = _Lease("a", 0, 4096)
    cache.offer(a)
    del wakes[:]
    cache.attached()
    assert wakes == [False]
    notices, _, counters, _ = _sent(cache)
    assert notices == [("a", False)] and counters == {0: (0, 1)}


def test_a_sleep_suspends_the_tier_until_the_wake():
    cache, wakes = _cache(allowance=64 * MiB)
    cache.offer(_Lease("a", 0, 4096))
    cache.offer(_Lease("b", 1, 2 * MiB))
    _sent(cache)
    del wakes[:]
    assert [lease.id for lease in cache.suspend()] == ["a", "b"]  # every device's, oldest first
    assert wakes == [True] and cache.cached_bytes == 0 and len(cache) == 0
    assert cache.offer(_Lease("c", 0, 4096)) is None  # a close while asleep is released, not kept
    assert cache.set_allowance(128 * MiB) == [] and cache.offer(_Lease("d", 0, 4096)) is None
    assert _sent(cache)[1] == ["a", "b"]
    cache.resume()
    assert cache.offer(_Lease("e", 0, 4096)) == () and cache.take(0, 4096).id == "e"
    cache.drain(discard=False)
    cache.resume()  # a drained tier stays drained
    assert cache.offer(_Lease("f", 0, 4096)) is None
