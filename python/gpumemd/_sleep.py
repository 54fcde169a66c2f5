"""Sleep and wake of a session (issue 35), once for the sync and the asyncio clients.

A sleep frees the session's device memory while the session keeps its leases; a wake brings the
memory back at the same addresses. What sleeps is whole segment mappings (see the daemon's
``offload`` package notes): a client maps segments whole and a lease is a slice of one.

**Sleep, in order** (:func:`sleep_steps`): the client cache tier gives back every cached lease
and keeps no close until the wake (:meth:`gpumemd._cache.ClientCache.suspend`); the daemon is
made to apply every release and notice sent so far (:data:`FLUSH`); the segments to sleep are set aside
(:meth:`gpumemd._mapping.MappingCache.set_aside`: every segment with a lease or hold here, with
one of the tags when given) and each mapping of them vacated (the address range kept,
inaccessible); then ``Allocator.Sleep`` names them as the client's unmap confirmation. On a
refusal, nothing changed at the daemon: each mapping is refilled from its own segment and the
daemon's error raised. On success the segments the daemon did not put to sleep (with tags, the
client's choice is a superset of the daemon's) are refilled the same way, and the others stay
vacated until the wake: their leases sleep (:attr:`gpumemd.Lease.asleep`).

**Wake** (:func:`wake_steps`): ``Allocator.Wake`` names, for each slept segment, the segment it
became; each vacated mapping is refilled from it (a path, or a descriptor from the fd channel,
host or CUDA VMM) and moves to its id, with every lease on it, each at its old offset. A slept
segment the wake does not name (its leases were all released meanwhile) is closed. Once nothing
sleeps, the tier keeps closes again.

The steps are generators without I/O: they yield effects (:data:`FLUSH`, :class:`Call`,
:class:`Blocking`) that each client performs in its own way (blocking in ``client.py``; awaited,
blocking work on an executor thread, in ``aio.py``) through :func:`run` or :func:`run_async`,
and are sent the result or thrown the error. The caller has paused its own work on the
session's memory before a sleep (as in vLLM): touching a sleeping lease's memory faults.

Thread-safety: the steps of one sleep or wake run one at a time; the mapping table guards
itself, vacate and refill are serialized by this sequence (the caller must not sleep or wake
one client from two threads at once).
"""
import collections
import logging

import grpc

from ._errors import GpumemdError
from ._replies import inconsistent
from ._stubs import pb

log = logging.getLogger("gpumemd")

#: What a sleep put to sleep: the leases (with tags, also the untagged ones in the same
#: segments) and their segments, the bytes of contents the daemon now keeps in host memory for
#: the session (all sleeps together), and the device bytes this sleep freed.
Slept = collections.namedtuple("Slept", ["lease_ids", "segment_ids", "host_bytes", "freed_bytes"])

#: What a wake brought back: the leases, and each slept segment id -> the segment it became.
Woken = collections.namedtuple("Woken", ["lease_ids", "segments"])

#: Effect: every release and notice sent so far is applied by the daemon once it is performed.
FLUSH = object()

#: Effect: a unary Allocator call (``method``, ``request``); its response, or GpumemdError.
Call = collections.namedtuple("Call", ["method", "request"])

#: Effect: local work that may block (mmap, a CUDA synchronize, the fd channel): ``fn(*args)``.
Blocking = collections.namedtuple("Blocking", ["fn", "args"])

#: The stream barrier's request: a lease the daemon refuses (size 0). Messages on a KeepAlive
#: stream are applied in order and a lease is answered after its message's releases, so its
#: reply says that everything sent before it was applied.
BARRIER_SIZE = 0


class _Run:
    """Steps being run: :meth:`next` sends them the last effect's outcome (``result`` or
    ``error``, set by the client) and gives the next effect, or None once they ended (their
    result in ``value``)."""

    def __init__(self, steps):
        self._steps = steps
        self.result = self.error = self.value = None

    def next(self):
        try:
            if self.error is None:
                effect = self._steps.send(self.result)
            else:
                effect = self._steps.throw(self.error)
        except StopIteration as done:
            self.value = done.value
            return None
        self.result = self.error = None
        return effect


def run(steps, perform):
    """Runs ``steps`` to their end, ``perform(effect)`` blocking; their result. An effect's
    error is thrown into the steps, which restore what they changed and raise it."""
    running = _Run(steps)
    while (effect := running.next()) is not None:
        try:
            running.result = perform(effect)
        except Exception as e:  # noqa: BLE001 (the steps decide)
            running.error = e
    return running.value


async def run_async(steps, perform):
    """As :func:`run`, with ``await perform(effect)``."""
    running = _Run(steps)
    while (effect := running.next()) is not None:
        try:
            running.result = await perform(effect)
        except Exception as e:  # noqa: BLE001 (the steps decide)
            running.error = e
    return running.value


def check_barrier(error):
    """The barrier lease's refusal (a :class:`GpumemdError`) says the daemon applied what came
    before it; an error of the stream itself (down, no answer) says nothing and is raised."""
    if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        raise error


def _checked(level, tags):
    if level not in (1, 2) or isinstance(level, bool):
        raise GpumemdError(grpc.StatusCode.INVALID_ARGUMENT,
                           "level: %r (expected: 1, contents kept in host memory, or 2, dropped)" % (level,))
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = [tags]
    tags = list(tags)
    for tag in tags:
        if not isinstance(tag, str):
            raise GpumemdError(grpc.StatusCode.INVALID_ARGUMENT, "tags: %r (expected: strings)" % (tag,))
    return tags


def sleep_steps(client, s, level, tags):
    """The steps of ``client.sleep(level, tags)`` on its session ``s`` (see the module notes);
    their result is a :data:`Slept`."""
    tags = _checked(level, tags)
    # A lease closed with after= is still the session's until its event completes (its poller
    # alone sends it): it sleeps with the rest, the vacate waits for the device's work first,
    # and its release later drops its contents.
    client._evicted(s, s.cache.suspend())
    try:
        yield FLUSH
        segment_ids = yield Blocking(vacate, (s.mappings, set(tags)))
    except BaseException:
        _resume_if_awake(s)
        raise
    request = pb.SleepRequest(session_id=s.id, level=level, tags=tags, vacated_segment_ids=segment_ids)
    try:
        response = yield Call("Sleep", request)
    except Exception:
        yield Blocking(restore, (s.mappings, segment_ids))
        _resume_if_awake(s)
        raise
    slept = set(response.segment_ids)
    yield Blocking(restore, (s.mappings, [i for i in segment_ids if i not in slept]))
    if not slept.issubset(segment_ids):
        log.warning("gpumemd: the daemon put segment(s) %s of session %s to sleep, which this process did not vacate: "
                    "their mappings here keep the memory until the wake", sorted(slept - set(segment_ids)), s.id)
    _resume_if_awake(s)
    return Slept(list(response.lease_ids), list(response.segment_ids), response.host_bytes, response.freed_bytes)


def wake_steps(client, s):
    """The steps of ``client.wake()`` on its session ``s``; their result is a :data:`Woken`."""
    response = yield Call("Wake", pb.WakeRequest(session_id=s.id))
    try:
        return (yield Blocking(refill_woken, (s.mappings, response)))
    finally:
        _resume_if_awake(s)


def _resume_if_awake(s):
    if not s.mappings.sleeping_ids():
        s.cache.resume()


def vacate(mappings, tags):
    """Sets aside the segments a sleep covers and vacates their mappings; their ids. On a
    failure every one is refilled from its own segment and put back, and the error raised."""
    chosen = mappings.set_aside(tags)
    try:
        for _, entry in chosen:
            for mapping in entry.mappings.values():
                mapping.vacate()
    except BaseException:
        restore(mappings, [segment_id for segment_id, _ in chosen])
        raise
    return [segment_id for segment_id, _ in chosen]


def restore(mappings, segment_ids):
    """Refills the vacated mappings of set-aside segments from their own segments (the daemon
    did not put them to sleep) and puts them back in the table; a mapping that cannot be
    refilled is logged and leaves the table (touching its views faults)."""
    for segment_id in segment_ids:
        entry = mappings.sleeping(segment_id)
        if entry is None:
            continue  # the session was lost meanwhile: its mappings are closed
        for mapping in list(entry.mappings.values()):
            if mapping.vacated and not mapping.closed:
                try:
                    _refill(mappings, mapping, entry.handle)
                except (GpumemdError, OSError, ValueError) as e:
                    log.warning("gpumemd: segment %d could not be mapped again at %#x after the sleep did not take "
                                "it: %s", segment_id, _address(mapping), e)
        mappings.put_back(segment_id)


def refill_woken(mappings, response):
    """Refills each slept segment's mappings from the segment the WakeResponse names for it,
    moving them (and their leases) to its id; closes those it does not name. A :data:`Woken`;
    the first failure is raised once every segment was tried."""
    lease_ids, moved, errors = [], {}, []
    for wake in response.segments:
        old, handle = wake.old_segment_id, wake.handle
        entry = mappings.sleeping(old)
        if entry is None:
            errors.append(inconsistent("the wake names segment %d, which does not sleep in this process" % old))
            continue
        if handle.segment_bytes != entry.segment_bytes:
            errors.append(inconsistent("the wake puts segment %d (%d bytes) into segment %d of %d bytes"
                                       % (old, entry.segment_bytes, handle.segment_id, handle.segment_bytes)))
        else:
            for mapping in list(entry.mappings.values()):
                try:
                    _refill(mappings, mapping, handle)
                except (GpumemdError, OSError, ValueError) as e:
                    errors.append(e)
        try:
            mappings.woken(old, handle)
        except GpumemdError as e:
            errors.append(e)
            continue
        moved[old] = handle.segment_id
        lease_ids.extend(wake.lease_ids)
    for old in mappings.sleeping_ids():
        if old not in moved and mappings.drop_sleeping(old):
            log.warning("gpumemd: the wake does not name segment %d, on which leases of this process slept: their "
                        "memory stays inaccessible", old)
    if errors:
        for e in errors[1:]:
            log.warning("gpumemd wake: %s", e)
        raise errors[0]
    return Woken(lease_ids, moved)


def _refill(mappings, mapping, handle):
    """Maps ``handle``'s segment (the same size) at a vacated mapping's address, with its access."""
    kind = handle.WhichOneof("kind")
    if kind == "host_shm_path" and mapping.kind == "host":
        mapping.refill(path=handle.host_shm_path)
        return
    if (kind, mapping.kind) not in (("fd_segment", "host"), ("cuda_vmm", "cuda")):
        raise inconsistent("segment %d: a %s mapping cannot be refilled from a %s handle"
                           % (handle.segment_id, mapping.kind, kind))
    descriptor = mappings.fetch_descriptor(handle, mapping.read_only)
    try:
        if descriptor.grant.segment_bytes != mapping.segment_bytes:
            raise inconsistent("segment %d: the fd channel's grant says segment_bytes %d, the mapping it refills is "
                               "%d bytes" % (handle.segment_id, descriptor.grant.segment_bytes, mapping.segment_bytes))
        mapping.refill(fd=descriptor.fd)
    finally:
        descriptor.close()


def _address(mapping):
    return getattr(mapping, "address", None) or getattr(mapping, "base", 0)
