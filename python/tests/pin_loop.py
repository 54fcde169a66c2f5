"""Run as another uid by test_pinning.py: the pinning loop of issue 32, with a raw gRPC client
(not the well-behaved library). Usage:

    pin_loop.py TARGET FD_SOCKET ROUNDS SIZE [keep|close-connection|unread]

Each round opens a session, leases SIZE bytes on device 0, fetches the segment's descriptor over
the fd channel, maps it, closes the descriptor and ends the session with CloseSession, keeping the
mapping (a host segment with mmap, a CUDA VMM segment with the driver's import and map). With
close-connection the fd-channel connection is also closed each round (the mapping
stays). It stops at the first refused lease or after ROUNDS rounds, prints one JSON object (the
rounds done, the bytes it still maps, the refusal's code and message), then waits for a line on
stdin before it exits, so that the test can look at the daemon's books while it lives.

With unread it does one round only, on a raw socket: it asks for the descriptor, shuts its socket
down for writing without reading the reply (the descriptor waits in its receive queue, out of
/proc's sight), ends the session, prints, and on a line from stdin reads the descriptor, maps it,
writes to it and prints whether that worked.
"""
import json
import mmap
import os
import socket
import struct
import sys

sys.path.insert(0, os.environ["GPUMEMD_PYTHON_DIR"])

import grpc  # noqa: E402

from gpumemd import _cuda, _fdchannel  # noqa: E402
from gpumemd._stubs import pb, pb_grpc  # noqa: E402


def read_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the daemon closed the connection")
        data += chunk
    return data


def unread(allocator, fd_socket, size):
    session = allocator.OpenSession(pb.OpenSessionRequest(client_name="unread", client_cache_bytes=0))
    lease = allocator.Lease(pb.LeaseRequest(session_id=session.session_id, device=0, size_bytes=size))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(fd_socket)
    request = pb.FdRequest(request_id=1, session_id=session.session_id, segment_id=lease.handle.segment_id,
                           read_only=False).SerializeToString()
    sock.sendall(struct.pack(">I", len(request)) + request)
    sock.recv(4, socket.MSG_PEEK | socket.MSG_WAITALL)  # the reply has come (its descriptor with it): leave it
    sock.shutdown(socket.SHUT_WR)  # the daemon sees the end of input; the reply waits unread here
    allocator.CloseSession(pb.CloseSessionRequest(session_id=session.session_id))
    print(json.dumps({"uid": os.getuid(), "segment_bytes": lease.handle.segment_bytes}), flush=True)
    sys.stdin.readline()
    length = struct.unpack(">I", read_exactly(sock, 4))[0]
    reply = pb.FdReply.FromString(read_exactly(sock, length))
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    mapping = mmap.mmap(fds[0], lease.handle.segment_bytes)
    os.close(fds[0])
    mapping[lease.handle.offset:lease.handle.offset + 4] = b"late"
    print(json.dumps({"granted": reply.HasField("granted"), "mapped": bytes(mapping[lease.handle.offset:
                                                                                     lease.handle.offset + 4]) == b"late"}),
          flush=True)
    sys.stdin.readline()


def main(target, fd_socket, rounds, size, mode="keep"):
    rounds, size = int(rounds), int(size)
    channel = grpc.insecure_channel(target)
    allocator = pb_grpc.AllocatorStub(channel)
    if mode == "unread":
        unread(allocator, fd_socket, size)
        return
    fds = _fdchannel.FdChannel(fd_socket, 10)
    mappings = []
    result = {"uid": os.getuid(), "rounds": 0, "refusal": None}
    for _ in range(rounds):
        session = allocator.OpenSession(pb.OpenSessionRequest(client_name="pinner", client_cache_bytes=0))
        try:
            lease = allocator.Lease(pb.LeaseRequest(session_id=session.session_id, device=0, size_bytes=size))
        except grpc.RpcError as e:
            result["refusal"] = {"code": e.code().name, "message": e.details()}
            allocator.CloseSession(pb.CloseSessionRequest(session_id=session.session_id))
            break
        handle = lease.handle
        descriptor = fds.fetch(session.session_id, handle.segment_id, False)
        if handle.WhichOneof("kind") == "cuda_vmm":  # a CUDA VMM segment: imported and mapped by the driver
            base, _ = _cuda.import_and_map(0, descriptor.fd, handle.segment_bytes, False)
            descriptor.close()
            _cuda.copy_to_device(0, base + handle.offset, b"pin!")
            mappings.append(handle.segment_bytes)
        else:
            mapping = mmap.mmap(descriptor.fd, handle.segment_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            descriptor.close()
            mapping[handle.offset:handle.offset + 4] = b"pin!"
            mappings.append(mapping)
        allocator.CloseSession(pb.CloseSessionRequest(session_id=session.session_id))
        if mode == "close-connection":
            fds.close()
        result["rounds"] += 1
    result["mapped_bytes"] = sum(m if isinstance(m, int) else len(m) for m in mappings)
    print(json.dumps(result), flush=True)
    sys.stdin.readline()
    fds.close()
    channel.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
