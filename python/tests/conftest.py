"""Fixtures: a real gpumemd daemon (host backend, Unix socket), started once per test session.

The daemon is server/target/gpumemd.jar (built by `mvn -B verify`, or
`mvn -B -q package -DskipTests`); GPUMEMD_JAR names another. Tests that need a daemon of their
own (shutdown, CUDA) start one with the `start_daemon` factory; `start_daemon(..., directory=d)`
starts one in the directory of an earlier one (same socket and shm dir: a restart).
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
sys.path.insert(0, PYTHON_DIR)

import gpumemd  # noqa: E402  (generates the stubs in a checkout)
from gpumemd._stubs import pb, pb_grpc  # noqa: E402

JAR = os.environ.get("GPUMEMD_JAR", os.path.join(REPO, "server", "target", "gpumemd.jar"))
CTL_JAR = os.environ.get("GPUMEMCTL_JAR", os.path.join(REPO, "ctl", "target", "gpumemctl.jar"))
JAVA = os.environ.get("JAVA", "java")

# The suite starts about a hundred daemons. As the Java tests' daemons do (DaemonProcess), they
# run on the serial collector and the quick compiler alone, and load their classes from an
# archive of a daemon's start made once per run (class data sharing, CDS_ARCHIVE): on two cores
# that took a daemon's start from 2.0 s to 1.1 s and the suite from 6.6 to 5.5 minutes. How a
# deployed daemon's JVM is set is the Java benchmarks' business (DaemonProcess.FULL_JIT).
DAEMON_JVM = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
CDS_ARCHIVE = os.path.join(PYTHON_DIR, "target", "gpumemd-daemon.jsa")
# An archive the JVM cannot use (another JDK, another jar) is skipped with a warning on stdout,
# which is the daemon's log: keep it out, the daemon starts as well without.
CDS_QUIET = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]


class Daemon:
    """A gpumemd process with its socket, shm directory and log."""

    def __init__(self, directory, *extra, log_name="gpumemd.log", prefix=(), jvm=None):
        """prefix: a command the daemon runs under (an unshare), before java; jvm: its JVM flags
        (by default DAEMON_JVM, and the class archive once there is one)."""
        if not os.path.exists(JAR):
            pytest.fail("%s is missing: build it first (mvn -B -q package -DskipTests)" % JAR)
        os.makedirs(directory, exist_ok=True)
        self.socket = os.path.join(directory, "gpumemd.sock")
        self.target = "unix://" + self.socket
        self.log_path = os.path.join(directory, log_name)
        if jvm is None:
            jvm = DAEMON_JVM + (["-XX:SharedArchiveFile=" + CDS_ARCHIVE] + CDS_QUIET
                                if os.path.exists(CDS_ARCHIVE) else [])
        args = list(prefix) + [JAVA] + jvm + ["-jar", JAR, "--socket", self.socket, "--shm-dir", os.path.join(directory, "shm"),
                "--metrics-port", "0", "--keepalive-grace-ms", "500"] + list(extra)
        if "--backend" not in extra:
            args += ["--backend", "host", "--host-devices", "2", "--host-device-bytes", "256MiB"]
        self.log = open(self.log_path, "wb")  # a restart in the same directory starts a new log
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket) or b"gpumemd ready" not in self._log_bytes():
            if self.process.poll() is not None:
                pytest.fail("gpumemd exited with %d at start:\n%s" % (self.process.returncode, self._log_bytes().decode()))
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail("gpumemd not ready after 60 s:\n" + self._log_bytes().decode())
            time.sleep(0.05)
        import grpc

        self.channel = grpc.insecure_channel(self.target)
        self.admin = pb_grpc.AdminStub(self.channel)

    def _log_bytes(self):
        with open(self.log_path, "rb") as f:
            return f.read()

    def leases(self, **request):
        return list(self.admin.ListLeases(pb.ListLeasesRequest(**request)).leases)

    def stats(self, device):
        return self.admin.GetStats(pb.GetStatsRequest(device=device)).devices[0]

    def kill(self, sig):
        """Ends the process with a signal (SIGTERM: a clean shutdown; SIGKILL: none) and waits."""
        self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.channel.close()
        self.log.close()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if hasattr(self, "channel"):
            self.channel.close()
        self.log.close()


def pytest_sessionstart(session):
    """Archives the classes of a daemon's start (CDS_ARCHIVE) when the jar is newer than the
    archive: one daemon started and stopped, its JVM writing what it loaded as it exits."""
    if not os.path.exists(JAR) or (os.path.exists(CDS_ARCHIVE)
                                   and os.path.getmtime(CDS_ARCHIVE) >= os.path.getmtime(JAR)):
        return
    os.makedirs(os.path.dirname(CDS_ARCHIVE), exist_ok=True)
    directory = tempfile.mkdtemp(prefix="gpumemd-cds-")
    written = os.path.join(directory, "classes.jsa")
    try:
        Daemon(directory, jvm=DAEMON_JVM + CDS_QUIET + ["-XX:ArchiveClassesAtExit=" + written]).stop()
        os.replace(written, CDS_ARCHIVE)  # whole or not at all: tests start daemons from it at once
    except (Exception, pytest.fail.Exception) as e:  # the suite runs as well without, only slower
        print("no class archive for the test daemons (%s): they start without one" % str(e).splitlines()[0])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("gpumemd")))
    yield d
    d.stop()


@pytest.fixture
def start_daemon(tmp_path):
    started = []

    def start(*extra, directory=None, log_name="gpumemd.log"):
        d = Daemon(directory or str(tmp_path / ("daemon%d" % len(started))), *extra, log_name=log_name)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def on_standin():
    """True where libcuda.so.1 is the tests' stand-in driver (cuda-standin/), not NVIDIA's: its
    devices are named so. Tests that only a real GPU can answer (kernels, their faults, peer
    access, timings) skip there, saying so."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    name = ctypes.create_string_buffer(256)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetName(name, 256, 0) != 0:
        return False
    return name.value.startswith(b"gpumemd stand-in")


def run_worker(*args, timeout=60):
    """Runs tests/worker.py in a new Python process; its stdout."""
    result = subprocess.run([sys.executable, os.path.join(HERE, "worker.py")] + [str(a) for a in args],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, "worker %s failed (%d):\n%s%s" % (args, result.returncode, result.stdout, result.stderr)
    return result.stdout


def run_java_peer(*args, timeout=120):
    """Runs tests/JavaPeer.java (the Java client, from the gpumemctl jar) in a JVM; its stdout."""
    if not os.path.exists(CTL_JAR):
        pytest.fail("%s is missing: build it first (mvn -B -q package -DskipTests)" % CTL_JAR)
    result = subprocess.run([JAVA, "-cp", CTL_JAR, os.path.join(HERE, "JavaPeer.java")] + [str(a) for a in args],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, "JavaPeer %s failed (%d):\n%s%s" % (args, result.returncode, result.stdout, result.stderr)
    return result.stdout
