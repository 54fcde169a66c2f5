"""Isolates the self-tests: a private CUDA_STANDIN_DIR (mode 01777, so a uid 65534 child can use
it) and a log file, set before the library's cuInit reads them."""
import os
import shutil
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

if "CUDA_STANDIN_DEVICES" not in os.environ:
    os.environ["CUDA_STANDIN_DEVICES"] = "2"
_state = tempfile.mkdtemp(prefix="cuda-standin-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
os.chmod(_state, 0o1777)
os.environ["CUDA_STANDIN_DIR"] = os.path.join(_state, "state")
os.environ["CUDA_STANDIN_LOG"] = os.path.join(_state, "main.log")
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
os.environ.pop("CUDA_STANDIN_VMM", None)
os.environ["CUDA_STANDIN_STREAM_DELAY_MS"] = "100"   # wide enough that "not landed yet" checks are not racy
STATE = _state


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_state, ignore_errors=True)


@pytest.fixture(scope="session")
def state_dir():
    return STATE
