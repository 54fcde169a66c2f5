"""Run as another uid by test_fd.py: what that user gets from the fd channel. Usage:

    fd_other_user.py TARGET FD_SOCKET SESSION_ID SEGMENT_ID

SESSION_ID and SEGMENT_ID are another tenant's (the test's). Prints one JSON object: the
refusal for that session and segment, the refusal for this user's own session and that segment,
whether this user's own lease maps, writes and reads through the descriptor it gets, and
whether a read-only descriptor of it reopens read-write through /proc/self/fd, and what Sleep
and Wake of that other tenant's session answer.
"""
import json
import os
import sys

sys.path.insert(0, os.environ["GPUMEMD_PYTHON_DIR"])

import gpumemd  # noqa: E402
from gpumemd import _fdchannel  # noqa: E402


def refusal(channel, session_id, segment_id):
    try:
        descriptor = channel.fetch(session_id, segment_id, False)
    except gpumemd.GpumemdError as e:
        return {"code": e.code.name, "message": e.message}
    descriptor.close()
    return {"code": "OK", "message": "a descriptor was granted"}


def reopen(channel, session_id, segment_id):
    """Whether a read-only descriptor of the segment reopens read-write through /proc/self/fd."""
    descriptor = channel.fetch(session_id, segment_id, True)
    try:
        fd = os.open("/proc/self/fd/%d" % descriptor.fd, os.O_RDWR)
    except PermissionError:
        return "refused"
    finally:
        descriptor.close()
    os.close(fd)
    return "reopened read-write"


def foreign_sleep_and_wake(gm, session_id):
    """Sleep (naming the other tenant's segment as vacated) and Wake of the other tenant's session."""
    from gpumemd.v1 import gpumemd_pb2 as pb
    out = {}
    for name, call in (("sleep", lambda: gm._stub.Sleep(pb.SleepRequest(session_id=session_id, level=2), timeout=10)),
                       ("wake", lambda: gm._stub.Wake(pb.WakeRequest(session_id=session_id), timeout=10))):
        try:
            call()
            out[name] = {"code": "OK"}
        except Exception as e:  # grpc.RpcError
            out[name] = {"code": e.code().name, "message": e.details()}
    return out


def main(target, fd_socket, session_id, segment_id):
    segment_id = int(segment_id)
    result = {"uid": os.getuid()}
    channel = _fdchannel.FdChannel(fd_socket, 10)
    result["foreign_session"] = refusal(channel, session_id, segment_id)
    with gpumemd.connect(target, client_name="other-user") as gm:
        result["own_session_foreign_segment"] = refusal(channel, gm.session_id, segment_id)
        result["foreign_sleep"] = foreign_sleep_and_wake(gm, session_id)
        with gm.lease(0, 4096) as lease:
            lease.buffer()[:5] = b"mine!"
            result["own_lease"] = {"segment": lease.segment_id, "bytes": bytes(lease.buffer()[:5]).decode(),
                                   "maps_opened": gm.stats().maps_opened,
                                   "reopen_read_only_descriptor": reopen(channel, gm.session_id, lease.segment_id)}
    channel.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
