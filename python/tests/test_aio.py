"""gpumemd.aio against the real daemon: the same contract, on an event loop (asyncio.run)."""
import asyncio
import signal

import grpc
import numpy
import pytest

import gpumemd
import gpumemd.aio


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_lease_write_read_errors_and_close(daemon, stream):
    async def main():
        async with await gpumemd.aio.connect(daemon.target, client_name="pytest-aio", stream=stream,
                                             client_cache_bytes=0) as gm:  # the daemon path: no tier
            leases = await asyncio.gather(*(gm.lease(0, 4096, zero=True) for _ in range(16)))
            assert len({l.id for l in leases}) == 16
            for i, lease in enumerate(leases):
                numpy.asarray(lease)[:] = i
            assert [bytes(l.buffer()[:1]) for l in leases] == [bytes([i]) for i in range(16)]
            for lease in leases:
                await lease.aclose()
                await lease.aclose()  # harmless
            async with await gm.lease(1, 1 << 20) as lease:
                lease.buffer()[0] = 1
            with pytest.raises(gpumemd.GpumemdError) as raised:
                await gm.lease(0, 0)
            assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT and "size_bytes: 0" in raised.value.message
            with pytest.raises(gpumemd.GpumemdError):
                lease.buffer()
            assert gm.stats().leases == 17 and gm.stats().releases == 17
            return gm.session_id
        
    session_id = asyncio.run(main())
    assert daemon.leases(session_id=session_id) == []


def test_shutdown_notice(start_daemon):
    d = start_daemon("--drain-timeout-ms", "2000")

    async def main():
        heard = []

        async def on_shutdown(drain_ms):
            heard.append(drain_ms)

        gm = await gpumemd.aio.connect(d.target, on_shutdown=on_shutdown)
        lease = await gm.lease(0, 4096)
        d.process.send_signal(signal.SIGTERM)
        assert await gm.wait_for_shutdown_notice(10) == 2000
        assert heard == [2000]
        await lease.aclose()
        await gm.close()
        await gm.close()

    asyncio.run(main())
    assert d.process.wait(15) == 0
