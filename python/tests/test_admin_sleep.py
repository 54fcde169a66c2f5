"""An admin's sleep and wake of another process's session (issue 35 item 5; README "Sleep and
wake"): a Python process that registered ``on_sleep_asked`` (sync, and asyncio with coroutine
callbacks; tests/asked_sleep_worker.py) is put to sleep with Admin.SleepSession, another
process's session leases the memory that freed, Admin.WakeSession brings it back, and the process
finds its array at its address with its bytes, its pause and resume having run once each. A
session whose client registered nothing is refused at once."""
import os
import subprocess
import sys
import time

import grpc
import pytest

from gpumemd._stubs import pb
from test_sleep import BIG, _other_session, _session, _start_worker

HERE = os.path.dirname(os.path.abspath(__file__))


def _start_asked(mode, target, size):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "asked_sleep_worker.py"), mode, target, str(size)],
                            stdout=subprocess.PIPE, text=True, env=env)


def _wake(d, session_id):
    """WakeSession, again for up to 5 s while the daemon answers RESOURCE_EXHAUSTED (the wake's
    "try again": memory another process gave back is free once the daemon saw its mappings go)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return d.admin.WakeSession(pb.WakeSessionRequest(session_id=session_id), timeout=30)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@pytest.mark.parametrize("mode", ["sync", "aio"])
def test_an_admin_sleeps_a_process_that_opted_in_and_wakes_it_with_its_bytes(start_daemon, mode):
    d = start_daemon("--backend", "host", "--host-devices", "1", "--host-device-bytes", "64MiB")
    worker = _start_asked(mode, d.target, BIG)
    try:
        line = worker.stdout.readline().split()
        assert line[0] == "leased", line
        session_id = line[1]
        assert _other_session(d, BIG) == "RESOURCE_EXHAUSTED"  # the budget holds one of them

        slept = d.admin.SleepSession(pb.SleepSessionRequest(session_id=session_id, level=1), timeout=30)
        assert len(slept.lease_ids) == 1 and slept.freed_bytes >= BIG and slept.host_bytes == BIG
        assert worker.stdout.readline().split() == ["paused", "1", "-"]
        assert _session(d, session_id).sleeping_leases == 1
        assert _other_session(d, BIG) == "leased"  # the freed memory serves another session

        woken = _wake(d, session_id)
        assert list(woken.segments[0].lease_ids) == list(slept.lease_ids)
        assert worker.stdout.readline().split() == ["resumed"]
        assert worker.stdout.readline().split() == ["result", "pauses=1", "resumes=1", "same=True", "kept=True"]
        assert worker.wait(30) == 0
    finally:
        worker.kill()
        worker.wait()


def test_a_session_whose_client_registered_no_handler_is_refused_at_once(start_daemon):
    d = start_daemon()
    worker = _start_worker("lease", d.target, 4096)
    try:
        line = worker.stdout.readline().split()
        assert line[0] == "leased", line
        with pytest.raises(grpc.RpcError) as refused:
            d.admin.SleepSession(pb.SleepSessionRequest(session_id=line[1]), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "session %s's client registered no sleep handler" % line[1] in refused.value.details()
        assert _session(d, line[1]).sleeping_leases == 0
        worker.stdin.write("done\n")
        worker.stdin.flush()
        assert worker.wait(30) == 0
    finally:
        worker.kill()
        worker.wait()
