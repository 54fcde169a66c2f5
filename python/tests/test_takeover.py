"""gpumemd --take-over under running workers: a Python worker (sync and asyncio) and a Java worker
hold leases, a shared hold and a published name and keep leasing while the daemon is taken over
three times in a row. No call fails, every byte stays, the sessions are the same ones, and the final
daemon's books balance: after everything is closed and a trim, it holds nothing."""
import asyncio
import os
import subprocess
import threading
import time

import numpy

import gpumemd
from gpumemd import aio
from conftest import CTL_JAR, HERE, JAVA, pb

TAKE_OVERS = 3
FLAGS = ("--keepalive-grace-ms", "5000")


class Loop:
    """Leases, writes, reads back and closes in a thread until stopped; records any failure."""

    def __init__(self, client):
        self.client = client
        self.count = 0
        self.failures = []
        self.ids = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        n = 0
        while not self.stop.is_set():
            size = 4096 << (n % 8)
            n += 1
            try:
                lease = self.client.lease(n % 2, size)
                a = numpy.asarray(lease)
                a[0] = 7
                a[-1] = 9
                if a[0] != 7 or a[-1] != 9:
                    self.failures.append("bytes changed under the writer")
                if not lease.local_hit:
                    if lease.id in self.ids:
                        self.failures.append("lease id %s handed out twice" % lease.id)
                    self.ids.add(lease.id)
                del a
                lease.close()
                self.count += 1
            except Exception as e:  # noqa: BLE001 -- every failure is a finding here
                self.failures.append(repr(e))

    def await_more(self, more, timeout=30):
        target = self.count + more
        deadline = time.monotonic() + timeout
        while self.count < target:
            assert time.monotonic() < deadline, "the loop is stuck at %d: %s" % (self.count, self.failures[:5])
            time.sleep(0.01)


def take_over(start_daemon, directory, old, round_):
    new = start_daemon(*FLAGS, "--take-over", directory=directory, log_name="gpumemd-%d.log" % round_)
    old.process.wait(30)
    assert old.process.returncode == 0, old._log_bytes().decode()
    assert b"handed over to pid %d" % new.process.pid in old._log_bytes()
    assert b"Took over from pid %d" % old.process.pid in new._log_bytes()
    return new


def test_python_and_java_workers_carry_on_across_three_take_overs(start_daemon, tmp_path):
    d = start_daemon(*FLAGS)
    directory = os.path.dirname(d.socket)
    stop = tmp_path / "stop"
    java = subprocess.Popen([JAVA, "-cp", CTL_JAR, os.path.join(HERE, "JavaLoop.java"), d.target, str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert java.stdout.readline().startswith("ready"), java.stdout.read()
    # The owner without a client cache tier: each lease of its loop is a round trip on the stream
    # that moves (the Java worker keeps its cache tier, whose books move too).
    with gpumemd.connect(d.target, "takeover-owner", client_cache_bytes=0) as owner, \
            gpumemd.connect(d.target, "takeover-holder") as holder:
        owner_session, holder_session = owner.session_id, holder.session_id
        shared = owner.lease(0, 1 << 20)
        numpy.asarray(shared)[:] = 0x31
        share = shared.share()
        hold = holder.attach(share.token)
        named = owner.lease(1, 3 << 20)
        numpy.asarray(named)[:] = 0x32
        owner.publish(named, "weights")
        by_name = holder.lookup("weights")
        loop = Loop(owner)
        loop.await_more(200)
        for round_ in range(1, TAKE_OVERS + 1):
            d = take_over(start_daemon, directory, d, round_)
            loop.await_more(200)
        loop.stop.set()
        loop.thread.join(30)
        assert loop.failures == []
        assert owner.session_id == owner_session and holder.session_id == holder_session
        assert (numpy.asarray(shared) == 0x31).all() and (numpy.asarray(hold) == 0x31).all()
        assert (numpy.asarray(named) == 0x32).all() and (numpy.asarray(by_name) == 0x32).all()
        stop.write_text("stop")
        out, _ = java.communicate(timeout=60)
        assert java.returncode == 0, out
        assert "failures 0 session same" in out, out
        # The last daemon's books hold exactly the two leases and two holds in use, and the leases
        # the owner keeps closed in its cache tier (still its own).
        assert len(d.leases()) == 4 + owner.stats().cached_leases + holder.stats().cached_leases
        for h in (hold, by_name, shared, named):
            h.close()
        share.revoke()
        owner.unpublish("weights")
    for device in (0, 1):
        deadline = time.monotonic() + 10
        while d.stats(device).leased_bytes and time.monotonic() < deadline:
            time.sleep(0.02)
        d.admin.Trim(pb.TrimRequest(device=device, keep_bytes=0))
        # A segment this process was sent the descriptor of is freed once the daemon has seen
        # (in /proc, at most a second later) that the process maps it no more.
        while d.stats(device).reserved_bytes and time.monotonic() < deadline + 5:
            time.sleep(0.02)
        s = d.stats(device)
        assert (s.leased_bytes, s.client_cached_bytes, s.reserved_bytes) == (0, 0, 0), s


def test_asyncio_worker_carries_on_across_a_take_over(start_daemon):
    d = start_daemon(*FLAGS)
    directory = os.path.dirname(d.socket)

    async def main():
        nonlocal d
        # No client cache tier: every lease is a round trip on the stream that moves.
        async with await aio.connect(d.target, "takeover-aio", client_cache_bytes=0) as client:
            session = client.session_id
            held = await client.lease(0, 1 << 20)
            numpy.asarray(held)[:] = 0x44
            done = 0
            failures = []
            stop = asyncio.Event()

            async def work():
                nonlocal done
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        lease = await client.lease(n % 2, 4096 << (n % 6))
                        numpy.asarray(lease)[0] = 1
                        await lease.aclose()
                        done += 1
                        await asyncio.sleep(0)  # a loop of local work would starve the event loop
                    except Exception as e:  # noqa: BLE001
                        failures.append(repr(e))

            task = asyncio.ensure_future(work())
            while done < 100:
                await asyncio.sleep(0.01)
            before = done
            d = await asyncio.get_running_loop().run_in_executor(None, take_over, start_daemon, directory, d, 1)
            deadline = time.monotonic() + 30
            while done < before + 100 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            stop.set()
            await task
            assert failures == []
            assert done >= before + 100
            assert client.session_id == session
            assert (numpy.asarray(held) == 0x44).all()

    asyncio.run(main())
