"""A worker process for the sharing tests (test_sharing.py, test_cuda.py). Usage:

    sharing_worker.py produce TARGET DEVICE SIZE SEED MAX_ATTACHES [READ_ONLY]
        lease, write the pattern, share; print "token segment offset block_bytes", exit without
        revoking (the token holds the block)
    sharing_worker.py publish TARGET DEVICE SIZE SEED NAME READ_ONLY
        lease, write the pattern, publish under NAME; print "segment offset block_bytes", exit
        (the name holds the block)
    sharing_worker.py attach TARGET TOKEN SIZE SEED [MODE]
    sharing_worker.py lookup TARGET NAME SIZE SEED [MODE]
        take a hold, print "segment offset hold_id read_only", check the pattern and, for a
        read-only hold, that writes fail; print "ok"; then MODE: "wait" (default) checks the
        pattern again once a line comes on stdin and closes the hold, "hold" sleeps until
        killed, "exit" closes at once
    cuda-produce / cuda-attach ...   the same on a CUDA device (driver copies); cuda-attach's MODE
        "write-refused" then checks that a driver copy into a read-only hold fails (VMM)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy  # noqa: E402

import gpumemd  # noqa: E402
from gpumemd import _cuda  # noqa: E402
from worker import pattern  # noqa: E402


def produce(target, device, size, seed, max_attaches, read_only="0", cuda=False):
    device, size, seed = int(device), int(size), int(seed)
    with gpumemd.connect(target, client_name="pytest-producer") as gm:
        lease = gm.lease(device, size)
        if cuda:
            _cuda.copy_to_device(lease.cuda_device, lease.device_ptr, pattern(size, seed).tobytes())
            _cuda.synchronize(lease.cuda_device)
        else:
            numpy.asarray(lease)[:] = pattern(size, seed)
        share = lease.share(max_attaches=int(max_attaches), read_only=read_only == "1")
        print(share.token, lease.segment_id, lease.offset, lease.block_bytes, flush=True)
        lease.close()  # the token holds the block now


def publish(target, device, size, seed, name, read_only):
    device, size, seed = int(device), int(size), int(seed)
    with gpumemd.connect(target, client_name="pytest-publisher") as gm:
        with gm.lease(device, size) as lease:
            numpy.asarray(lease)[:] = pattern(size, seed)
            gm.publish(lease, name, read_only=read_only == "1")
            print(lease.segment_id, lease.offset, lease.block_bytes, flush=True)


def check_read_only(hold):
    view = hold.buffer()
    try:
        view[0] = 1
    except TypeError:
        pass
    else:
        sys.exit("a write to the read-only hold's memoryview went through")
    try:
        numpy.asarray(hold)[0] = 1
    except ValueError as e:
        if "read-only" not in str(e):
            sys.exit("unexpected numpy error: %s" % e)
    else:
        sys.exit("a write to the read-only hold's array went through")


def check_cuda_write_refused(hold):
    """A read-only hold on a VMM segment: a driver copy into it must fail (PROT_READ access).
    Prints the mapping's kind and "refused" with the driver's error; exits non-zero otherwise."""
    print(type(hold._mapping).__name__, int(hold._mapping.read_only), flush=True)
    try:
        _cuda.copy_to_device(hold.cuda_device, hold.device_ptr, b"\xff" * 16)
        _cuda.synchronize(hold.cuda_device)
    except gpumemd.GpumemdError as e:
        print("refused", e.message.replace(" ", "_"), flush=True)
        os._exit(0)  # the context may be unusable after the fault: no orderly close through it
    sys.exit("a write through the read-only hold went through")


def take(how, target, key, size, seed, mode="wait", cuda=False):
    size, seed = int(size), int(seed)
    with gpumemd.connect(target, client_name="pytest-consumer") as gm:
        hold = gm.attach(key, tag="pytest") if how == "attach" else gm.lookup(key, tag="pytest")
        assert hold.attached and hold.size == size, hold
        print(hold.segment_id, hold.offset, hold.id, int(hold.read_only), flush=True)
        if cuda:
            if _cuda.copy_from_device(hold.cuda_device, hold.device_ptr, size) != pattern(size, seed).tobytes():
                sys.exit("pattern mismatch in %r" % hold)
            if mode == "write-refused":
                check_cuda_write_refused(hold)
        else:
            if not numpy.array_equal(numpy.asarray(hold), pattern(size, seed)):
                sys.exit("pattern mismatch in %r" % hold)
            if hold.read_only:
                check_read_only(hold)
        print("ok", flush=True)
        if mode == "wait":
            sys.stdin.readline()
            if not cuda and not numpy.array_equal(numpy.asarray(hold), pattern(size, seed)):
                sys.exit("pattern changed under the hold %r" % hold)
        elif mode == "hold":
            time.sleep(3600)
        hold.close()


def main(command, *args):
    if command == "produce":
        produce(*args)
    elif command == "cuda-produce":
        produce(*args, cuda=True)
    elif command == "publish":
        publish(*args)
    elif command in ("attach", "lookup"):
        take(command, *args)
    elif command == "cuda-attach":
        take("attach", *args, cuda=True)
    else:
        sys.exit("unknown command %r" % command)


if __name__ == "__main__":
    main(*sys.argv[1:])
