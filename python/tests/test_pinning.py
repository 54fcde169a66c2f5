"""Memory a process maps stays on the books (issue 32, item 2): a tenant that leases, maps the
segment's descriptor and ends its session in a loop used to leave the daemon counting the memory
free while the process still mapped it (1.8 GB past a 100 MiB quota in 2 s). Now every segment
whose descriptor a live process was sent stays allocated and counted against that process's
tenant until the process exits or, for a process that closed its fd-channel connection, until the
kernel shows it maps the segment no more. The attacker runs as uid 65534 with a raw gRPC client."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

import gpumemd
from conftest import HERE, PYTHON_DIR, Daemon
from gpumemd._stubs import pb, pb_grpc

MiB = 1 << 20
QUOTA = 100 * MiB
SIZE = 20 * MiB  # a large request: a segment of its own each round
ROUNDS = 30  # 600 MiB: far past the quota, within the device

ROOT_LEASE = """import sys
sys.path.insert(0, sys.argv[1])
import gpumemd
with gpumemd.connect(sys.argv[2], client_name="root") as gm:
    with gm.lease(0, int(sys.argv[3])) as lease:
        lease.buffer()[:4] = b"root"
        print(bytes(lease.buffer()[:4]).decode())
"""

needs_other_uid = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                     reason="another uid needs root and setpriv")


@pytest.fixture
def quota_daemon():
    """A node daemon: every local user may connect, a 100 MiB tenant quota, and no cache, so
    that every released segment is evicted at once (what a trim or the retention cap does)."""
    directory = tempfile.mkdtemp(prefix="gpumemd-pin-", dir="/tmp")
    os.chmod(directory, 0o711)
    d = Daemon(directory, "--backend", "host", "--host-devices", "1", "--host-device-bytes", "1GiB", "--socket-mode", "0666",
               "--tenant-max-leased-bytes", str(QUOTA), "--retention-cap-bytes", "0", "--client-cache-bytes", "0")
    yield d
    d.stop()
    shutil.rmtree(directory, ignore_errors=True)


OWN_PID_NAMESPACE = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")


@pytest.fixture
def hidden_quota_daemon():
    """quota_daemon in a PID namespace of its own, where it cannot see its clients' pids."""
    if os.geteuid() != 0 or subprocess.run(list(OWN_PID_NAMESPACE) + ["true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --pid cannot make a PID namespace here (it needs root)")
    directory = tempfile.mkdtemp(prefix="gpumemd-pin-ns-", dir="/tmp")
    os.chmod(directory, 0o711)
    d = Daemon(directory, "--backend", "host", "--host-devices", "1", "--host-device-bytes", "1GiB", "--socket-mode", "0666",
               "--tenant-max-leased-bytes", str(QUOTA), "--retention-cap-bytes", "0", "--client-cache-bytes", "0",
               prefix=OWN_PID_NAMESPACE)
    yield d
    d.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def vmm_quota_daemon():
    """quota_daemon on CUDA VMM segments (issue 33 item 3): cuMemRelease frees nothing while
    another process maps the allocation, so the same books must hold there."""
    if not gpumemd.cuda_available():
        pytest.skip("no usable CUDA device (libcuda.so.1 missing or no GPU reported)")
    directory = tempfile.mkdtemp(prefix="gpumemd-pin-vmm-", dir="/tmp")
    os.chmod(directory, 0o711)
    d = Daemon(directory, "--backend", "cuda", "--cuda-handles", "vmm", "--device-limit-bytes", "1GiB",
               "--socket-mode", "0666", "--tenant-max-leased-bytes", str(QUOTA), "--retention-cap-bytes", "0",
               "--client-cache-bytes", "0")
    yield d
    d.stop()
    shutil.rmtree(directory, ignore_errors=True)


def start_pinner(daemon, mode, rounds=ROUNDS):
    env = dict(os.environ, GPUMEMD_PYTHON_DIR=PYTHON_DIR)
    process = subprocess.Popen(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
         os.path.join(HERE, "pin_loop.py"), daemon.target, daemon.socket + ".fd", str(rounds), str(SIZE), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = process.stdout.readline()
    if not line:
        process.kill()
        pytest.fail("pin_loop.py failed:\n" + process.stderr.read())
    return process, json.loads(line)


def finish(process):
    """Lets the attacker go on to its end (it waits for a line at each step), or kills it."""
    try:
        process.stdin.write("go on\ndone\n")
        process.stdin.flush()
        process.wait(30)
    except (BrokenPipeError, subprocess.TimeoutExpired):
        process.kill()
        process.wait()


def awaiting_bytes(daemon):
    return daemon.stats(0).awaiting_unmap_bytes


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s not reached within %.0f s" % (what, timeout)
        time.sleep(0.05)


@needs_other_uid
@pytest.mark.parametrize("mode", ["keep", "close-connection"])
def test_the_pinning_loop_ends_at_the_tenants_quota_and_root_leases_on(quota_daemon, mode):
    assert_the_loop_ends_at_the_quota_and_frees_at_exit(quota_daemon, mode)


@needs_other_uid
@pytest.mark.parametrize("mode", ["keep", "close-connection"])
def test_the_pinning_loop_from_a_pid_namespace_the_daemon_cannot_see_ends_at_the_quota(hidden_quota_daemon, mode):
    """The daemon in a PID namespace of its own (a pod without hostPID), the attacker in this one:
    the kernel gives the attacker's pid as 0, and the daemon follows it by pidfd instead."""
    assert_the_loop_ends_at_the_quota_and_frees_at_exit(hidden_quota_daemon, mode)
    assert "connected from a PID namespace this daemon cannot see" not in hidden_quota_daemon._log_bytes().decode()


@needs_other_uid
def test_a_successor_in_the_same_hidden_pid_namespace_keeps_following_what_the_process_maps(tmp_path):
    """A take-over between two daemons in one PID namespace the attacker is outside of: the
    running daemon sends the pidfds of the processes it follows with the state, so the successor
    keeps what such a process maps on the books until it exits (without them, it could not tell
    when the process exits, and would free the memory at its first sweep)."""
    namespace = pid_namespace_holder()
    try:
        enter = ("nsenter", "-t", str(namespace.pid_inside), "-p", "-m", "--")
        directory = tempfile.mkdtemp(prefix="gpumemd-pin-ns-to-", dir="/tmp")
        os.chmod(directory, 0o711)
        flags = ("--backend", "host", "--host-devices", "1", "--host-device-bytes", "1GiB", "--socket-mode", "0666",
                 "--tenant-max-leased-bytes", str(QUOTA), "--retention-cap-bytes", "0", "--client-cache-bytes", "0")
        old = Daemon(directory, *flags, prefix=enter)
        process, result = start_pinner(old, "close-connection", rounds=2)
        try:
            assert result["refusal"] is None and result["mapped_bytes"] == 2 * SIZE
            assert awaiting_bytes(old) == 2 * SIZE
            new = Daemon(directory, *flags, "--take-over", prefix=enter, log_name="gpumemd-successor.log")
            try:
                old.process.wait(30)
                assert old.process.returncode == 0, old._log_bytes().decode()
                assert b"Took over from pid" in new._log_bytes(), new._log_bytes().decode()
                # Its admin channel connected while the old daemon still had the socket.
                new.channel.close()
                new.channel = grpc.insecure_channel(new.target)
                new.admin = pb_grpc.AdminStub(new.channel)
                # Two full sweeps (one a second) later the process's mappings are still on the books.
                time.sleep(2.5)
                assert awaiting_bytes(new) == 2 * SIZE, new._log_bytes().decode()
                finish(process)
                wait_until(lambda: awaiting_bytes(new) == 0, 10, "the exited process's segments freed by the successor")
            finally:
                new.stop()
        finally:
            finish(process)
            old.stop()
            shutil.rmtree(directory, ignore_errors=True)
    finally:
        namespace.kill()
        namespace.wait()


def pid_namespace_holder():
    """A PID namespace of its own, held by a sleeping first process (whose exit would end every
    other process there): daemons enter it with nsenter. Skips where it cannot be made."""
    if os.geteuid() != 0 or not shutil.which("nsenter"):
        pytest.skip("a PID namespace to enter needs root and nsenter")
    holder = subprocess.Popen(list(OWN_PID_NAMESPACE) + ["sleep", "600"])
    children = "/proc/%d/task/%d/children" % (holder.pid, holder.pid)
    deadline = time.monotonic() + 10
    while True:
        with open(children) as f:
            pids = f.read().split()
        if pids:
            holder.pid_inside = int(pids[0])  # its pid here: nsenter -t takes it
            return holder
        if holder.poll() is not None or time.monotonic() > deadline:
            holder.kill()
            pytest.skip("unshare --pid cannot make a PID namespace here")
        time.sleep(0.02)


def assert_the_loop_ends_at_the_quota_and_frees_at_exit(daemon, mode):
    process, result = start_pinner(daemon, mode)
    try:
        assert result["uid"] == 65534
        refusal = result["refusal"]
        assert refusal is not None, "the loop was never refused: %d rounds, %d bytes mapped past the books" % (
            result["rounds"], result["mapped_bytes"])
        assert refusal["code"] == "RESOURCE_EXHAUSTED"
        assert "--tenant-max-leased-bytes" in refusal["message"]
        assert "still mapped by its processes" in refusal["message"]
        # What it maps is what the daemon keeps for it, within its quota.
        assert result["mapped_bytes"] <= QUOTA
        assert 1 <= result["rounds"] <= QUOTA // SIZE
        assert awaiting_bytes(daemon) >= result["mapped_bytes"]

        # Another tenant (root) is untouched: the rest of the device is there. In a process of
        # its own, which exits: a process the daemon cannot see keeps what it was sent until then.
        root = subprocess.run([sys.executable, "-c", ROOT_LEASE, PYTHON_DIR, daemon.target, str(QUOTA)],
                              capture_output=True, text=True, timeout=60)
        assert root.returncode == 0 and root.stdout == "root\n", root.stderr
    finally:
        finish(process)
    # The process is gone: what it kept goes back to the device.
    wait_until(lambda: awaiting_bytes(daemon) == 0, 10, "the exited process's segments freed")
    assert daemon.stats(0).reserved_bytes == 0


def test_a_client_that_closed_and_unmapped_keeps_nothing_on_the_books(quota_daemon):
    # The well-behaved library: it unmaps and closes its fd-channel connection when it closes,
    # and the daemon then sees (in /proc) that this live process maps the segment no more.
    with gpumemd.connect(quota_daemon.target, client_name="tidy") as gm:
        with gm.lease(0, SIZE) as lease:
            lease.buffer()[:4] = b"tidy"
    wait_until(lambda: quota_daemon.stats(0).reserved_bytes == 0, 10, "the closed client's segment freed")
    # And its tenant's quota is whole again.
    with gpumemd.connect(quota_daemon.target, client_name="tidy-again") as gm:
        with gm.lease(0, QUOTA) as lease:
            assert lease.block_bytes >= QUOTA


@needs_other_uid
def test_a_descriptor_left_unread_in_a_half_closed_socket_keeps_its_segment(quota_daemon):
    # The process shuts its socket down for writing and never reads the reply: /proc shows no
    # mapping and no descriptor, yet the descriptor waits in its receive queue. The daemon asked
    # the kernel (SIOCOUTQ) before it closed its end, so it keeps the segment until the process exits.
    process, result = start_pinner(quota_daemon, "unread")
    try:
        assert result["uid"] == 65534
        # A sweep runs after a connection ends: a tidy client's segment freed shows one has run
        # since the attacker's connection ended.
        with gpumemd.connect(quota_daemon.target, client_name="tidy") as gm:
            with gm.lease(0, SIZE) as lease:
                lease.buffer()[:4] = b"tidy"
        wait_until(lambda: awaiting_bytes(quota_daemon) <= result["segment_bytes"], 10, "the tidy segment freed")
        assert awaiting_bytes(quota_daemon) == result["segment_bytes"]

        # And the threat was real: the process maps the segment from the descriptor it left unread.
        process.stdin.write("read\n")
        process.stdin.flush()
        late = json.loads(process.stdout.readline())
        assert late == {"granted": True, "mapped": True}
        assert awaiting_bytes(quota_daemon) == result["segment_bytes"]
    finally:
        finish(process)
    wait_until(lambda: awaiting_bytes(quota_daemon) == 0, 10, "the exited process's segment freed")


@needs_other_uid
def test_the_pinning_loop_on_cuda_vmm_segments_ends_at_the_quota_and_frees_at_exit(vmm_quota_daemon):
    """The loop with VMM segments mapped through the driver: refused at the quota while it maps
    them, and their memory back once it exits (on the stand-in driver, cuMemGetInfo counts an
    allocation still mapped anywhere; on a GPU, the device does)."""
    process, result = start_pinner(vmm_quota_daemon, "keep")
    try:
        refusal = result["refusal"]
        assert refusal is not None, "the loop was never refused: %d rounds, %d bytes mapped past the books" % (
            result["rounds"], result["mapped_bytes"])
        assert refusal["code"] == "RESOURCE_EXHAUSTED" and "--tenant-max-leased-bytes" in refusal["message"]
        assert "still mapped by its processes" in refusal["message"]
        assert 1 <= result["rounds"] <= QUOTA // SIZE
        assert awaiting_bytes(vmm_quota_daemon) >= result["mapped_bytes"]
    finally:
        finish(process)
    wait_until(lambda: awaiting_bytes(vmm_quota_daemon) == 0, 10, "the exited process's segments freed")
    assert vmm_quota_daemon.stats(0).reserved_bytes == 0
