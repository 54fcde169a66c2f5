"""A client process for the sleep and wake tests (tests/test_sleep.py). Usage:

    sleep_worker.py lease TARGET SIZE   lease SIZE bytes on device 0 and fill them: print "leased
                                        SESSION", or the refusal's code; then wait for a line on
                                        stdin, close and exit
    sleep_worker.py sleep TARGET SIZE   lease SIZE bytes, fill them, put the session to sleep
                                        (level 1): print "asleep SESSION"; then wait to be killed
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpumemd  # noqa: E402


def main(mode, target, size):
    size = int(size)
    with gpumemd.connect(target, client_name="sleep-worker-%s" % mode) as gm:
        try:
            lease = gm.lease(0, size)
        except gpumemd.GpumemdError as e:
            print(e.code.name, flush=True)
            return
        lease.buffer()[:] = b"\x5a" * size
        if mode == "lease":
            print("leased", gm.session_id, flush=True)
            sys.stdin.readline()
            lease.close()
        else:
            gm.sleep(1)
            print("asleep", gm.session_id, flush=True)
            time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:])
