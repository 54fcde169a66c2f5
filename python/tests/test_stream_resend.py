"""Stream leases and releases across broken KeepAlive streams, with a real daemon: a proxy
process between client and daemon (stream_proxy.py) is SIGKILLed again and again while the
client leases and releases in a loop on the session's stream (no client cache: every lease is a
round trip, every release a notice). The client numbers its messages and sends again, on the
next stream, those the daemon had not applied (StreamAttached.applied_messages): every call
succeeds, the session is the same throughout, and the daemon's leases of the session are the
client's (besides the first grants of leases whose reply was lost with a connection, which the
client asked for again and counts: see gpumemd._keepalive.MessageLog)."""
import asyncio
import os
import random
import threading
import time

import gpumemd
from gpumemd.aio import connect as aio_connect

from test_cache_reattach import _Proxy, _until

BLOCK = 64 << 10
KILLS = 20


def _daemon_leases(d, session_id):
    return {lease.lease_id for lease in d.leases(session_id=session_id, page_size=5000)}


def _agree(d, session_id, held, log):
    theirs = _daemon_leases(d, session_id)
    mine = {lease.id for lease in held}
    return mine <= theirs and len(theirs) == len(mine) + log.replies_lost


def _check_books(d, session_id, held, log):
    _until(lambda: _agree(d, session_id, held, log), "the daemon's leases of the session are the client's",
           state=lambda: "(daemon: %d, client: %d, replies lost: %d, resent: %d)" % (
               len(_daemon_leases(d, session_id)), len(held), log.replies_lost, log.resent))
    assert log.resent > 0, "no message was sent again: the test broke no message in flight"


def test_sync_leases_and_releases_in_flight_as_the_stream_breaks_are_applied_once(start_daemon, tmp_path):
    d = start_daemon("--keepalive-grace-ms", "60000", "--client-cache-bytes", "0")
    path = str(tmp_path / "proxy.sock")
    proxy = _Proxy(path, d.socket)
    gm = gpumemd.connect("unix://" + path, client_name="resend-sync")
    session_id = gm.session_id
    held, lock, stop, failures, calls = [], threading.Lock(), threading.Event(), [], [0]

    def work(seed):
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                with lock:
                    lease = held.pop() if held and (len(held) >= 16 or rnd.random() < 0.5) else None
                if lease is None:
                    lease = gm.lease(0, BLOCK, timeout=30)  # bounded: a lost lease fails the test, not hangs it
                    with lock:
                        held.append(lease)
                else:
                    lease.close()
                calls[0] += 1
        except BaseException as e:  # noqa: B902 (reported by the test)
            failures.append(e)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    try:
        for w in workers:
            w.start()
        for _ in range(KILLS):
            before = calls[0]
            _until(lambda: calls[0] >= before + 50 or failures, "the workers made progress")
            proxy.kill()  # mid-flight: requests and releases go into a dying connection
            proxy = _Proxy(path, d.socket)
        stop.set()
        for w in workers:
            w.join(60)
            assert not w.is_alive(), "a worker is stuck"
        assert not failures, "a call failed: %r" % failures
        assert gm.session_id == session_id and gm.session_generation == 1
        _check_books(d, session_id, held, gm._s.log)
        print("sync: %d calls, %d messages sent again, %d lease replies lost"
              % (calls[0], gm._s.log.resent, gm._s.log.replies_lost))
        for lease in held:
            lease.close()
    finally:
        stop.set()
        gm.close()
        proxy.kill()
    assert d.stats(0).leased_bytes == 0


def test_aio_leases_and_releases_in_flight_as_the_stream_breaks_are_applied_once(start_daemon, tmp_path):
    d = start_daemon("--keepalive-grace-ms", "60000", "--client-cache-bytes", "0")
    path = str(tmp_path / "proxy.sock")

    async def main():
        proxy = _Proxy(path, d.socket)
        gm = await aio_connect("unix://" + path, client_name="resend-aio")
        session_id = gm.session_id
        held, calls, stop = [], [0], asyncio.Event()

        async def work(seed):
            rnd = random.Random(seed)
            while not stop.is_set():
                if held and (len(held) >= 16 or rnd.random() < 0.5):
                    held.pop().close()
                else:
                    held.append(await gm.lease(0, BLOCK, timeout=30))
                calls[0] += 1
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(work(i)) for i in range(4)]
        try:
            for _ in range(KILLS):
                before = calls[0]
                deadline = time.monotonic() + 30
                while calls[0] < before + 50 and not any(t.done() for t in tasks):
                    assert time.monotonic() < deadline, "the workers made no progress"
                    await asyncio.sleep(0.002)
                proxy.kill()
                proxy = _Proxy(path, d.socket)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)  # raises what a call raised
            assert gm.session_id == session_id and gm.session_generation == 1
            log = gm._s.log
            deadline = time.monotonic() + 30
            while not _agree(d, session_id, held, log) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            _check_books(d, session_id, held, log)
            print("aio: %d calls, %d messages sent again, %d lease replies lost" % (calls[0], log.resent,
                                                                                    log.replies_lost))
            for lease in held:
                lease.close()
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await gm.close()
            proxy.kill()

    asyncio.run(main())
    assert d.stats(0).leased_bytes == 0
