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

#: Effect: an application's sleep handler callback ``fn(*args)``, run as :data:`Blocking` by the
#: sync client (on the thread answering the admin) and awaited when it returns an awaitable by
#: the asyncio client (on its loop).
class Hook(Blocking):
    __slots__ = ()


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


def sleep_steps(client, s, level, tags, admin_request_id=0):
    """The steps of ``client.sleep(level, tags)`` on its session ``s`` (see the module notes);
    their result is a :data:`Slept`. ``admin_request_id``: the admin's request it answers."""
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
    request = pb.SleepRequest(session_id=s.id, level=level, tags=tags, vacated_segment_ids=segment_ids,
                              admin_request_id=admin_request_id)
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


def wake_steps(client, s, admin_request_id=0):
    """The steps of ``client.wake()`` on its session ``s``; their result is a :data:`Woken`."""
    response = yield Call("Wake", pb.WakeRequest(session_id=s.id, admin_request_id=admin_request_id))
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


# ---------------------------------------------------------------------- an admin's sleep and wake

class SleepAsks:
    """An admin's sleep and wake of the client's session (``gpumemctl sleep SESSION``;
    SessionEvent.sleep_asked), mixed into :class:`gpumemd._session.ClientCore`: the consent (the
    application's ``pause`` and ``resume`` callbacks, told to the daemon on every stream's attach
    and when they change) and, for each ask, the steps of :func:`asked_steps`, which each client
    runs off its stream's reader through ``_answer_asked(s, steps)`` (a thread; a task)."""

    _sleep_hooks = None

    def on_sleep_asked(self, pause, resume=None):
        """Lets an admin put this session to sleep and wake it (``gpumemctl sleep SESSION``,
        ``gpumemctl wake SESSION``); the daemon refuses an admin's sleep of a session whose client
        did not opt in, since touching a sleeping lease's memory faults. ``pause(level, tags)``
        runs before the sleep and returns once no work touches the session's memory (raise to
        refuse: the admin gets FAILED_PRECONDITION with the message, nothing sleeps);
        ``resume()`` runs after the wake, or after a sleep the daemon refused. Neither runs on the
        stream's reader: the sync client calls them on a thread of its own, the asyncio client on
        its loop (a coroutine function is awaited). ``pause`` None withdraws the consent."""
        self._sleep_hooks = None if pause is None else (pause, resume)
        s = self._s
        if s is not None and not s.lost:
            s.queue.put_nowait(("sleep_handler", pause is not None))

    def _sleep_handler_attached(self, s):
        """A stream of ``s`` attached: the daemon hears of the handler again (nothing if none)."""
        if self._sleep_hooks is not None:
            s.queue.put_nowait(("sleep_handler", True))

    def _sleep_asked(self, s, ask):
        log.info("gpumemd: an admin asks to %s session %s (request %d)", "wake" if ask.wake else "sleep", s.id,
                 ask.request_id)
        self._answer_asked(s, asked_steps(self, s, ask, self._sleep_hooks))


def asked_steps(client, s, ask, hooks):
    """The answer to an admin's ask (a SleepAsked) on session ``s``: sleep is ``pause``, then the
    client's sleep naming the request, and ``resume`` when that failed; wake is the client's wake,
    then ``resume``. Whatever fails before the daemon heard of it is sent as the request's refusal,
    so the admin always gets an answer (a refusal of one it already has is refused in turn)."""
    if hooks is None:
        yield from _refuse(s, ask, grpc.StatusCode.FAILED_PRECONDITION, "this process withdrew its sleep handler")
        return
    pause, resume = hooks
    if ask.wake:
        try:
            yield from wake_steps(client, s, ask.request_id)
        except Exception as e:  # noqa: BLE001 (the session stays asleep: no resume)
            log.warning("gpumemd: an admin's wake of session %s failed; it stays asleep: %s", s.id, e)
            return
        yield from _resume(resume)
        return
    try:
        yield Hook(pause, (ask.level, list(ask.tags)))
    except Exception as e:  # noqa: BLE001 (the application refuses)
        yield from _refuse(s, ask, grpc.StatusCode.FAILED_PRECONDITION, "its sleep handler refused to pause: %s" % e)
        return
    try:
        yield from sleep_steps(client, s, ask.level, list(ask.tags), ask.request_id)
    except Exception as e:  # noqa: BLE001 (nothing slept)
        code = e.code if isinstance(e, GpumemdError) else grpc.StatusCode.INTERNAL
        yield from _refuse(s, ask, code, "its sleep failed: %s" % e)
        log.warning("gpumemd: an admin's sleep of session %s failed, resuming: %s", s.id, e)
        yield from _resume(resume)


def _refuse(s, ask, code, why):
    log.warning("gpumemd: refusing an admin's %s of session %s: %s", "wake" if ask.wake else "sleep", s.id, why)
    refused = pb.StreamError(code=code.value[0], message=why)
    request = (pb.WakeRequest(session_id=s.id, admin_request_id=ask.request_id, refused=refused) if ask.wake
               else pb.SleepRequest(session_id=s.id, admin_request_id=ask.request_id, refused=refused))
    try:
        yield Call("Wake" if ask.wake else "Sleep", request)
    except Exception as e:  # noqa: BLE001 (the admin had its answer, or its call timed out)
        log.debug("gpumemd: refusal not taken: %s", e)


def _resume(resume):
    if resume is None:
        return
    try:
        yield Hook(resume, ())
    except Exception:  # noqa: BLE001 (the application's)
        log.exception("gpumemd: the sleep handler's resume failed")
