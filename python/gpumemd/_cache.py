"""The client cache tier and the notices of one session, without I/O.

A closed lease that fits the allowance the daemon granted (``OpenSessionResponse.
client_cache_bytes``) is kept mapped here instead of being released, and serves a later lease
of the same device without a round trip. The block stays the session's lease at the daemon
(client-cached bytes); the daemon hears of each move in a ``CacheNotice`` (closed into the cache,
or handed out again), batched: a move costs a dict update, and what is pending goes with the
next message on the KeepAlive stream (a stream lease, an acknowledgement), or with a flush at
most :data:`FLUSH_DELAY` later. A close into the cache and a reuse of the same lease cancel out,
so a worker that leases and closes locally sends only its counters. Releases of the stream path
are pending here too, in order: a release supersedes a pending cache notice of the same lease
(the daemon releases a lease in either state), and an eviction's release is never sent after
the cache notice of the lease it made room for. What a broken stream lost is sent again, as the
very messages the daemon did not apply (``gpumemd._keepalive.MessageLog``).

The algorithm is the Java client's (``ClientCache``), with the size classes the daemon states at
``OpenSession`` (:class:`SizeRules`; no copy of its table here):

- **offer** (a lease is closed): kept when its block fits the allowance, making room by giving
  back the least recently cached leases; a block larger than the whole allowance is released.
- **take** (a lease is asked for): the request rounded up to 512 B; best fit = the smallest
  cached block of the device at least that large, and at most :meth:`SizeRules.largest_fit` (one small
  segment for a request up to 1 MiB, the request plus the daemon's ``--max-oversize-bytes``
  above it).
- **give back** (``ReturnCache``, a smaller ``CacheAllowance``, a shutdown notice): least
  recently cached first, until enough bytes are out.

Thread-safety: every method takes this object's own lock (a ``threading.Lock``, which the
asyncio client's loop takes uncontended); the critical sections are a bisect, a few dict
updates and counters. ``wake(urgent)`` is called outside the lock.
"""
import bisect
import threading

from ._stubs import pb

FLUSH_DELAY = 0.001         # seconds a pending notice waits for a message to ride on
MAX_ENTRIES = 8192          # the daemon's limit on entries in one KeepAliveRequest


class SizeRules:
    """How the daemon's pools round and class requests, as it states them at ``OpenSession``
    (``OpenSessionResponse.size_classes`` and ``max_oversize_bytes``), so that this tier picks the
    blocks the daemon would. The defaults are what a daemon that predates those fields uses."""

    __slots__ = ("alignment", "small_max", "small_segment", "max_oversize")

    def __init__(self, alignment=512, small_max=1 << 20, small_segment=2 << 20, max_oversize=20 << 20):
        self.alignment = alignment
        self.small_max = small_max
        self.small_segment = small_segment
        self.max_oversize = max_oversize

    @classmethod
    def of(cls, opened):
        """The rules an ``OpenSessionResponse`` states; a field it lacks keeps its default."""
        rules = cls()
        if opened.HasField("size_classes"):
            c = opened.size_classes
            rules.alignment, rules.small_max, rules.small_segment = (c.alignment_bytes, c.small_max_bytes,
                                                                     c.small_segment_bytes)
        if opened.HasField("max_oversize_bytes"):
            rules.max_oversize = opened.max_oversize_bytes
        return rules

    def round_up(self, size):
        """A request rounded up to the alignment, as the daemon rounds it."""
        return -(-size // self.alignment) * self.alignment

    def largest_fit(self, rounded):
        """The largest cached block that may serve a rounded request: one small segment for a
        small request, the request plus the oversize allowance for a large one."""
        return self.small_segment if rounded <= self.small_max else rounded + self.max_oversize

    def __repr__(self):
        return "SizeRules(alignment=%d, small_max=%d, small_segment=%d, max_oversize=%d)" % (
            self.alignment, self.small_max, self.small_segment, self.max_oversize)


class ClientCache:
    """The cached leases of one session (see the module notes), its pending notices and the
    tier's cumulative counters per device. ``wake(urgent)`` asks the session's KeepAlive stream
    to send what is pending: within :data:`FLUSH_DELAY`, or at once when ``urgent`` (the daemon
    asked for memory back)."""

    def __init__(self, allowance, rules, wake):
        self.allowance = allowance
        self.rules = rules
        self._wake = wake
        self._lock = threading.Lock()
        self._by_size = {}   # device -> sorted [(block bytes, seq)]
        self._by_age = {}    # seq -> lease, least recently cached first (insertion order)
        self._seq = 0
        self.cached_bytes = 0
        self._notices = {}   # lease id -> reused, the net move since the last send
        self._releases = []  # lease ids to release, in order
        self._counters = {}  # device -> [hits, returns], cumulative
        self._version = 0    # changes with every counter
        self._version_sent = 0
        self._scheduled = False  # a wake was asked for and its flush has not run yet
        self._drained = False
        self._refusing = False   # offers are refused: drained for good, or suspended by a sleep
        self._discarded = False
        self.local_hits = 0

    def __len__(self):
        return len(self._by_age)

    # ------------------------------------------------------------------ the hot path

    def take(self, device, size):
        """The best-fitting cached lease for ``size`` bytes on ``device``, removed from the
        cache (its reuse noticed), or None."""
        with self._lock:
            keys = self._by_size.get(device)
            if not keys:
                return None
            rules = self.rules
            rounded = rules.round_up(size)
            i = bisect.bisect_left(keys, (rounded, -1))
            if i == len(keys):
                return None
            nbytes, seq = keys[i]
            if nbytes > rules.largest_fit(rounded):
                return None
            del keys[i]
            lease = self._by_age.pop(seq)
            self.cached_bytes -= nbytes
            self.local_hits += 1
            counters = self._counters.get(device)
            if counters is None:
                counters = self._counters[device] = [0, 0]
            counters[0] += 1
            self._version += 1
            if self._notices.pop(lease.id, None) is None:
                self._notices[lease.id] = True
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._wake(False)
        return lease

    def offer(self, lease):
        """Keeps a closed lease when it fits the allowance, making room by removing the least
        recently cached ones (their releases pending before the newcomer's notice). None when
        not kept (the caller releases it); else the leases removed, usually none, whose
        mappings the caller releases."""
        nbytes = lease.block_bytes
        with self._lock:
            if self._refusing or nbytes > self.allowance:
                return None
            evicted = ()
            if self.cached_bytes + nbytes > self.allowance:
                evicted = self._remove_oldest(None, self.cached_bytes + nbytes - self.allowance)
            seq = self._seq = self._seq + 1
            device = lease.device
            keys = self._by_size.get(device)
            if keys is None:
                keys = self._by_size[device] = []
            bisect.insort(keys, (nbytes, seq))
            self._by_age[seq] = lease
            self.cached_bytes += nbytes
            counters = self._counters.get(device)
            if counters is None:
                counters = self._counters[device] = [0, 0]
            counters[1] += 1
            self._version += 1
            if self._notices.pop(lease.id, None) is None:
                self._notices[lease.id] = False
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._wake(False)
        return evicted

    def release(self, lease_id):
        """A release notice for the stream (none once the session is lost)."""
        with self._lock:
            if self._discarded:
                return
            self._notices.pop(lease_id, None)
            self._releases.append(lease_id)
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._wake(False)

    # ------------------------------------------------------------------ giving back

    def give_back(self, device, nbytes):
        """``ReturnCache``: removes least recently cached leases of ``device`` until at least
        ``nbytes`` are out (all of them for 0), their releases pending and sent at once; the
        leases removed (the caller releases their mappings)."""
        with self._lock:
            out = self._remove_oldest(device, nbytes if nbytes > 0 else None)
        if out:
            self._wake(True)
        return out

    def set_allowance(self, nbytes):
        """``CacheAllowance`` (0 = none), or 0 at a shutdown notice: removes least recently
        cached leases until the cache fits; the leases removed, as :meth:`give_back`."""
        with self._lock:
            self.allowance = nbytes
            out = self._remove_oldest(None, self.cached_bytes - nbytes) if self.cached_bytes > nbytes else []
        if out:
            self._wake(True)
        return out

    def _remove_oldest(self, device, nbytes):
        """Removes least recently cached leases (of ``device``, or any for None) until ``nbytes``
        are out (all for None), recording their releases; under the lock."""
        victims = []
        removed = 0
        for seq, lease in self._by_age.items():
            if nbytes is not None and removed >= nbytes:
                break
            if device is None or lease.device == device:
                victims.append((seq, lease))
                removed += lease.block_bytes
        for seq, lease in victims:
            self._remove(seq, lease)
        return [lease for _, lease in victims]

    def _remove(self, seq, lease):
        """Takes one cached lease out, its release pending (superseding a pending notice of it);
        under the lock."""
        del self._by_age[seq]
        keys = self._by_size[lease.device]
        del keys[bisect.bisect_left(keys, (lease.block_bytes, seq))]
        self.cached_bytes -= lease.block_bytes
        self._notices.pop(lease.id, None)
        self._releases.append(lease.id)

    def refused(self, lease_id):
        """The daemon refused to count ``lease_id`` as cached (RESOURCE_EXHAUSTED: past the
        allowance it holds the session to, which a notice sent before a lowered allowance
        arrived can meet): the lease stays in use at the daemon, so the tier must not keep it.
        Takes it out, its release pending; the lease (the caller releases its mapping), or None
        when it is not in the tier (handed out again since: in use at both ends, the books
        agree)."""
        with self._lock:
            for seq, lease in self._by_age.items():
                if lease.id == lease_id:
                    self._remove(seq, lease)
                    break
            else:
                return None
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._wake(False)
        return lease

    def drain(self, discard):
        """Empties the cache for good: the client closes (what is pending still goes out, and
        CloseSession takes the cached leases back) or, with ``discard``, the session is lost
        (nothing more is sent: the daemon that granted the leases is gone). Later offers and
        takes find nothing and keep nothing; the leases that were cached are returned."""
        with self._lock:
            out = list(self._by_age.values())
            self._drained = self._refusing = True
            self._by_age.clear()
            self._by_size.clear()
            self.cached_bytes = 0
            if discard:
                self._discarded = True
                self._notices.clear()
                self._releases.clear()
        return out

    def suspend(self):
        """A sleep begins (see gpumemd._sleep): every cached lease is given back (the leases
        removed, as :meth:`give_back`) and closes are not kept until :meth:`resume`, so that
        nothing of a sleeping session is client-cached and no lease is served here while the
        daemon refuses leases to the session."""
        with self._lock:
            self._refusing = True
            out = self._remove_oldest(None, None)
        if out:
            self._wake(True)
        return out

    def resume(self):
        """Nothing of the session sleeps any more: closes are kept again (unless drained)."""
        with self._lock:
            self._refusing = self._drained

    # ------------------------------------------------------------------ sending

    def fill(self, message, room):
        """Moves what is pending into ``message`` (a KeepAliveRequest), at most ``room``
        entries: releases first (an eviction's before the notice it made room for), then cache
        notices, then the counters if they changed. True when some had no room (the caller
        sends another message at once)."""
        with self._lock:
            self._scheduled = False
            if self._discarded:
                return False
            releases = self._releases
            if releases:
                n = min(room, len(releases))
                message.releases.extend(pb.StreamRelease(lease_id=lease_id) for lease_id in releases[:n])
                del releases[:n]
                room -= n
            notices = self._notices
            while notices and room > 0:
                lease_id = next(iter(notices))
                reused = notices.pop(lease_id)
                message.cache_notices.add(lease_id=lease_id, reused=reused)
                room -= 1
            if self._version != self._version_sent and room >= len(self._counters):
                for device, (hits, returns) in self._counters.items():
                    message.client_counters.add(device=device, hits=hits, returns=returns)
                self._version_sent = self._version
            left = bool(releases or notices or self._version != self._version_sent)
            if left:
                self._scheduled = True
            return left

    def attached(self):
        """The KeepAlive stream attached: a flush of what is pending (a wake may have gone to
        the broken stream)."""
        with self._lock:
            self._scheduled = True
        self._wake(False)
