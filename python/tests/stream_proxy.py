"""A Unix-socket proxy in its own process, for tests that break a client's connection to the
daemon: ``stream_proxy.py LISTEN_PATH TARGET_PATH`` forwards each connection to LISTEN_PATH to
a new one to TARGET_PATH, byte for byte, and prints ``ready`` once it listens. Killing the
process closes every connection at once, as a network failure would; starting it again on the
same path lets the client reconnect."""
import os
import socket
import sys
import threading


def _pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main(listen_path, target_path):
    if os.path.exists(listen_path):
        os.unlink(listen_path)  # a killed proxy's socket file
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(listen_path)
    server.listen(16)
    print("ready", flush=True)
    while True:
        client, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(target_path)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
