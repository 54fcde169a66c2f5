"""Run as another uid by test_cuda.py: what that user gets from a VMM daemon's fd channel. Usage:

    cuda_other_user.py TARGET FD_SOCKET SESSION_ID SEGMENT_ID

SESSION_ID and SEGMENT_ID are another tenant's (the test's). Prints one JSON object: the
refusal for that session and segment, the refusal for this user's own session and that segment,
and whether this user's own lease is a VMM mapping it can write and read.
"""
import json
import os
import sys

sys.path.insert(0, os.environ["GPUMEMD_PYTHON_DIR"])

import gpumemd  # noqa: E402
from gpumemd import _cuda, _fdchannel  # noqa: E402


def refusal(channel, session_id, segment_id):
    try:
        descriptor = channel.fetch(session_id, segment_id, False)
    except gpumemd.GpumemdError as e:
        return {"code": e.code.name, "message": e.message}
    descriptor.close()
    return {"code": "OK", "message": "a descriptor was granted"}


def main(target, fd_socket, session_id, segment_id):
    segment_id = int(segment_id)
    result = {"uid": os.getuid()}
    channel = _fdchannel.FdChannel(_fdchannel.socket_path(target, fd_socket), 10)
    result["foreign_session"] = refusal(channel, session_id, segment_id)
    with gpumemd.connect(target, client_name="other-user") as gm:
        result["own_session_foreign_segment"] = refusal(channel, gm.session_id, segment_id)
        with gm.lease(0, 1 << 20) as lease:
            _cuda.copy_to_device(lease.cuda_device, lease.device_ptr, b"mine!")
            result["own_lease"] = {"segment": lease.segment_id, "mapping": type(lease._mapping).__name__,
                                   "bytes": _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, 5).decode()}
    channel.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
