"""Stream-ordered releases: leases closed with ``close(after=stream)``, waiting for the event
recorded on that stream before their release goes to the daemon.

The daemon is sent no event handle (an IPC event opens only within the daemon's PID namespace,
and its exporter could not know when to destroy it): the client records a plain event in its
own process, polls it, and releases the lease once the event has completed, so the daemon
reuses the block only after the work queued before it. The caller of ``close(after=...)`` never
waits. Both clients poll the same table, each in its own way: the sync client on a thread of
its own, the asyncio client in a task on its loop (:meth:`DeferredReleases.poll` never blocks:
``cuEventQuery`` returns at once). Between polls they sleep :meth:`DeferredReleases.delay`:
from 0.2 ms, doubling while nothing completes, up to 20 ms.

What becomes of each pending release:

- its event completed: ``poll`` returns it, the client sends its release, its event is destroyed;
- its event reports an error (the work failed, the context is broken): the lease is not
  released (the GPU may still touch the block, for all the client knows), a warning names it,
  its event is destroyed; the session's end gives the block back;
- its session was lost: dropped with its event (the daemon took the lease back);
- the client closes: :meth:`DeferredReleases.abandon` after a bounded wait, for those still
  running: their events are destroyed (which does not wait for their work), and the leases go
  back with the session only once :class:`QueuedWork` has seen the work end (see below).

An event is any object with ``query()`` (True once complete, False while not, raises on an
error) and ``destroy()``; :class:`gpumemd._cuda.Event` on a GPU.

Closing: nothing of the session goes back to the daemon (CloseSession) while this process's GPU
work may still use it, since the daemon leases a returned block to the next process at once.
:class:`QueuedWork` synchronizes the primary context of every CUDA device the session maps
(``cuCtxSynchronize``: it covers the leases never closed and the pending releases, whose streams
belong to that context) on a thread of its own, since it cannot be bounded; the client waits for
it up to the rest of its close bound. ``DONE``: CloseSession, then the unmaps. ``RUNNING`` at the
bound: the session is kept, its blocks leased (the close returns, the client refuses calls, and
the stream and mappings stay until the synchronize returns; then the session is closed).
``FAILED`` (a sticky context error: whether the work ran, or still may, is unknown): the session
is kept until the process exits. The process's exit ends it either way (its GPU work ends with
it; the daemon takes the session back after its grace period).

Thread-safe: one lock guards the table; events are queried and destroyed outside it by the one
poller (and by ``abandon``, once the poller is stopped).
"""
import logging
import threading
import time

log = logging.getLogger("gpumemd")

MIN_DELAY = 0.0002  # seconds between polls while releases are pending, doubling ...
MAX_DELAY = 0.02    # ... up to this while nothing completes


class Pending:
    """A lease whose release waits for ``event``, on session ``session``."""

    __slots__ = ("session", "lease", "event")

    def __init__(self, session, lease, event):
        self.session = session
        self.lease = lease
        self.event = event


class DeferredReleases:
    """The pending stream-ordered releases of one client (see the module notes)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = []
        self._delay = MIN_DELAY

    def add(self, session, lease, event):
        with self._lock:
            self._pending.append(Pending(session, lease, event))
            self._delay = MIN_DELAY

    def __len__(self):
        with self._lock:
            return len(self._pending)

    def poll(self):
        """Queries every pending event once; the :class:`Pending` whose event completed (their
        events destroyed), in the order they were added, for the caller to release. Drops
        those of lost sessions and those whose event failed (see the module notes)."""
        with self._lock:
            pending = list(self._pending)
        ready, done = [], set()
        for item in pending:
            if item.session.lost:
                done.add(id(item))
            else:
                try:
                    if not item.event.query():
                        continue
                    ready.append(item)
                except Exception as e:  # noqa: BLE001 (a driver error: the lease stays held)
                    log.warning("gpumemd: the GPU work that lease %s waited for reports an error (%s); it is not "
                                "released, the session's end gives it back", item.lease.id, e)
                done.add(id(item))
            _destroy(item)
        with self._lock:
            self._pending = [item for item in self._pending if id(item) not in done]
            self._delay = MIN_DELAY if done else min(MAX_DELAY, self._delay * 2)
        return ready

    def delay(self):
        """Seconds to sleep before the next poll."""
        with self._lock:
            return self._delay

    def abandon(self):
        """Drops every pending release, destroying its event; the leases, for a warning."""
        with self._lock:
            pending, self._pending = self._pending, []
        for item in pending:
            _destroy(item)
        return [item.lease for item in pending]


def _destroy(item):
    try:
        item.event.destroy()
    except Exception as e:  # noqa: BLE001 (nothing more to do with it)
        log.warning("gpumemd: destroying the event of lease %s failed: %s", item.lease.id, e)


DONE, RUNNING, FAILED = "done", "running", "failed"


class PollerThread:
    """The sync client's poller of its :class:`DeferredReleases`: a thread, started by the first
    :meth:`wake`, that calls ``send_ready()`` (one :meth:`DeferredReleases.poll`, sending what
    completed), sleeping :meth:`DeferredReleases.delay` between polls and waiting for work while
    none is pending, until :meth:`stop`. (The asyncio client polls in a task on its loop.)
    Thread-safe: its condition guards the thread and the stop."""

    def __init__(self, releases, send_ready, name):
        self._releases = releases
        self._send_ready = send_ready
        self._name = name
        self._cond = threading.Condition()  # new releases, the stop
        self._thread = None
        self._stopped = False

    def wake(self):
        """A release was deferred: start the thread, or wake it."""
        with self._cond:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
                self._thread.start()
            self._cond.notify_all()

    def is_alive(self):
        return self._thread is not None and self._thread.is_alive()

    def _run(self):
        while True:
            with self._cond:
                while not self._stopped and len(self._releases) == 0:
                    self._cond.notify_all()  # a closing client waits for the table to empty
                    self._cond.wait()
                if self._stopped:
                    return
            self._send_ready()
            with self._cond:
                if not self._stopped and len(self._releases):
                    self._cond.wait(self._releases.delay())

    def stop(self, seconds):
        """Waits up to ``seconds`` for the pending releases to go out, then stops the thread
        (a release call in flight ends first, within 5 s)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while len(self._releases) and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.05))
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(5)


class QueuedWork:
    """The GPU work that may still use a closing session's memory: ``synchronize(device)`` (a
    :func:`gpumemd._cuda.synchronize`) of each of ``devices``, started at once on a daemon
    thread; :meth:`wait` says ``DONE``, ``RUNNING`` or ``FAILED`` (see the module notes)."""

    def __init__(self, devices, synchronize=None):
        self.devices = list(devices)
        self.failure = None
        self._done = threading.Event()
        if not self.devices:
            self._done.set()
            return
        if synchronize is None:
            from . import _cuda
            synchronize = _cuda.synchronize
        self._synchronize = synchronize
        threading.Thread(target=self._run, daemon=True, name="gpumemd-gpu-sync").start()

    def _run(self):
        try:
            for device in self.devices:
                self._synchronize(device)
        except Exception as e:  # noqa: BLE001 (a driver error: the work's state is unknown)
            self.failure = e
        finally:
            self._done.set()

    def wait(self, seconds=None):
        """Waits up to ``seconds`` (None: until the synchronize returns)."""
        if not self._done.wait(None if seconds is None else max(0.0, seconds)):
            return RUNNING
        return FAILED if self.failure is not None else DONE
