"""The sync client survives a daemon restart (SIGTERM or SIGKILL, then a new daemon on the same
socket and shm dir): the old session's leases die clearly, the next lease opens a new session."""
import logging
import os
import signal
import time

import numpy
import pytest

import gpumemd

RESTARTS = 3


@pytest.mark.parametrize("sig, stream", [(signal.SIGTERM, True), (signal.SIGKILL, True), (signal.SIGKILL, False)],
                         ids=["sigterm-stream", "sigkill-stream", "sigkill-unary"])
def test_client_survives_restarts(start_daemon, caplog, sig, stream):
    caplog.set_level(logging.INFO, logger="gpumemd")
    d = start_daemon("--drain-timeout-ms", "300")
    directory = os.path.dirname(d.socket)
    with gpumemd.connect(d.target, "restart-test", stream=stream, timeout=10,
                         client_cache_bytes=0) as client:  # closed leases go back to the daemon
        lease = client.lease(0, 4096, tag="before")
        lease.buffer()[:4] = b"old0"
        held = numpy.asarray(lease)  # an array the user keeps across the restart
        for round_ in range(1, RESTARTS + 1):
            old_session = client.session_id
            d.kill(sig)
            d = start_daemon("--drain-timeout-ms", "300", directory=directory)
            started = time.monotonic()
            fresh = client.lease(0, 4096, zero=True, tag="after-%d" % round_)
            assert time.monotonic() - started < 12
            # the old lease is dead, clearly
            assert lease.lost
            with pytest.raises(gpumemd.GpumemdError, match="session lost"):
                lease.buffer()
            lease.close()  # a no-op, no error
            # the array taken before the loss still points at the old daemon's memory
            assert bytes(held[:4]) == b"old%d" % (round_ - 1)
            # the new lease works, on a new session, with its own bytes
            assert client.session_id != old_session
            assert client.session_generation == round_ + 1
            assert not fresh.lost
            assert bytes(fresh.buffer()[:4]) == b"\0\0\0\0"
            fresh.buffer()[:4] = b"old%d" % round_
            held = numpy.asarray(fresh)
            assert [l.tag for l in d.leases()] == ["after-%d" % round_]
            assert bytes(held[:4]) == b"old%d" % round_
            lease = fresh
        lease.close()
        assert not lease.lost
        deadline = time.monotonic() + 10
        while d.leases() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert d.leases() == []
    lost = [r for r in caplog.records if r.levelno == logging.WARNING and "lost" in r.getMessage()]
    opened = [r for r in caplog.records if r.levelno == logging.INFO and "opened new session" in r.getMessage()]
    assert len(lost) == RESTARTS, [r.getMessage() for r in lost]
    assert len(opened) == RESTARTS, [r.getMessage() for r in opened]


def test_lease_fails_unavailable_when_no_daemon_comes_back(start_daemon, monkeypatch):
    from gpumemd import client as client_module

    monkeypatch.setattr(client_module, "_REOPEN_SECONDS", 0.5)
    d = start_daemon()
    with gpumemd.connect(d.target, "restart-test", timeout=10) as client:
        lease = client.lease(0, 1024)
        d.kill(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lease.lost and client.session_lost
        started = time.monotonic()
        with pytest.raises(gpumemd.GpumemdError) as error:
            client.lease(0, 1024)
        assert error.value.code.name == "UNAVAILABLE" and "session lost" in error.value.message
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_aio_client_survives_restarts(start_daemon, sig):
    import asyncio

    import gpumemd.aio

    first = start_daemon("--drain-timeout-ms", "300")
    directory = os.path.dirname(first.socket)

    async def main():
        d = first
        async with await gpumemd.aio.connect(d.target, "restart-aio", timeout=10) as gm:
            lease = await gm.lease(0, 4096, tag="before")
            lease.buffer()[:4] = b"old0"
            for round_ in (1, 2):
                old_session = gm.session_id
                await asyncio.to_thread(d.kill, sig)
                d = await asyncio.to_thread(start_daemon, "--drain-timeout-ms", "300", directory=directory)
                fresh = await asyncio.wait_for(gm.lease(0, 4096, zero=True, tag="after-%d" % round_), 12)
                assert lease.lost
                with pytest.raises(gpumemd.GpumemdError, match="session lost"):
                    lease.buffer()
                await lease.aclose()  # a no-op
                assert gm.session_id != old_session and gm.session_generation == round_ + 1
                assert bytes(fresh.buffer()[:4]) == b"\0\0\0\0"
                fresh.buffer()[:4] = b"old%d" % round_
                assert [l.tag for l in d.leases()] == ["after-%d" % round_]
                lease = fresh
            await lease.aclose()
            assert not lease.lost

    asyncio.run(main())
