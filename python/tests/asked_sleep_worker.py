"""A client process that an admin puts to sleep and wakes (tests/test_admin_sleep.py). Usage:

    asked_sleep_worker.py sync|aio TARGET SIZE

Leases SIZE bytes on device 0, fills them with a pattern, registers ``on_sleep_asked`` (the
asyncio client with coroutine callbacks) and prints "leased SESSION". Its pause prints "paused
LEVEL TAGS", its resume "resumed". Once resumed it checks the lease's bytes through the array it
made before the sleep, at the same address, prints "result pauses=N resumes=N same=B kept=B"
and exits. It gives up after 60 s.
"""
import asyncio
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy  # noqa: E402

import gpumemd  # noqa: E402
import gpumemd.aio  # noqa: E402


def _pattern(size):
    return ((numpy.arange(size, dtype=numpy.int64) * 11 + 3) % 251).astype(numpy.uint8)


def _report(array, address, size, counts):
    same = array.__array_interface__["data"][0] == address
    kept = bool(numpy.array_equal(array, _pattern(size)))
    print("result pauses=%d resumes=%d same=%s kept=%s" % (counts["pause"], counts["resume"], same, kept), flush=True)


def run_sync(target, size):
    counts = {"pause": 0, "resume": 0}
    resumed = threading.Event()

    def pause(level, tags):
        counts["pause"] += 1
        print("paused", level, ",".join(tags) or "-", flush=True)

    def resume():
        counts["resume"] += 1
        print("resumed", flush=True)
        resumed.set()

    with gpumemd.connect(target, client_name="asked-sleeper") as gm:
        lease = gm.lease(0, size)
        array = numpy.asarray(lease)
        array[:] = _pattern(size)
        address = array.__array_interface__["data"][0]
        gm.on_sleep_asked(pause, resume)
        print("leased", gm.session_id, flush=True)
        if not resumed.wait(60):
            print("result never-resumed", flush=True)
            os._exit(3)
        _report(array, address, size, counts)
        del array
        lease.close()


async def run_aio(target, size):
    counts = {"pause": 0, "resume": 0}
    resumed = asyncio.Event()

    async def pause(level, tags):
        counts["pause"] += 1
        print("paused", level, ",".join(tags) or "-", flush=True)

    async def resume():
        counts["resume"] += 1
        print("resumed", flush=True)
        resumed.set()

    gm = await gpumemd.aio.connect(target, client_name="asked-sleeper-aio")
    try:
        lease = await gm.lease(0, size)
        array = numpy.asarray(lease)
        array[:] = _pattern(size)
        address = array.__array_interface__["data"][0]
        gm.on_sleep_asked(pause, resume)
        print("leased", gm.session_id, flush=True)
        try:
            await asyncio.wait_for(resumed.wait(), 60)
        except asyncio.TimeoutError:
            print("result never-resumed", flush=True)
            os._exit(3)
        _report(array, address, size, counts)
        del array
        await lease.aclose()
    finally:
        await gm.close()


if __name__ == "__main__":
    mode, target, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "sync":
        run_sync(target, size)
    else:
        asyncio.run(run_aio(target, size))
