"""Self-tests of the CUDA stand-in driver (ctypes against the built library).

Run: bash cuda-standin/build.sh OUT && LD_LIBRARY_PATH=OUT CUDA_STANDIN_DEVICES=2 /usr/bin/python3 -m pytest cuda-standin/tests
Each strict rule has a test that checks the error code (and, for most, the one log line)."""
import ctypes as C
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import HERE, STATE
from cs import *  # noqa: F401,F403
import cs

PY = "/usr/bin/python3"
NOBODY = 65534
PRELUDE = "import sys, os, socket, struct, time, ctypes as C\nfrom cs import *\n"

INVALID_VALUE, OUT_OF_MEMORY, NOT_INITIALIZED, NO_DEVICE, INVALID_DEVICE = 1, 2, 3, 100, 101
INVALID_CONTEXT, INVALID_HANDLE, NOT_FOUND, NOT_READY, ILLEGAL_ADDRESS, NOT_SUPPORTED = 201, 400, 500, 600, 700, 801


# ------------------------------------------------------------------ helpers
def spawn(code, env=None, uid=None, pass_fds=()):
    e = dict(os.environ)
    e["PYTHONPATH"] = HERE
    e["CUDA_STANDIN_LOG"] = ""          # children log to stderr
    e.update(env or {})
    cmd = [PY, "-u", "-c", PRELUDE + textwrap.dedent(code)]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] + cmd
    return subprocess.Popen(cmd, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, pass_fds=pass_fds, cwd="/")


def run(code, **kw):
    p = spawn(code, **kw)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


def ok(code, **kw):
    rc, out, err = run(code, **kw)
    assert rc == 0, f"child failed rc={rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out, err


def log_mark():
    try:
        return os.path.getsize(os.environ["CUDA_STANDIN_LOG"])
    except FileNotFoundError:
        return 0


def log_since(mark):
    try:
        with open(os.environ["CUDA_STANDIN_LOG"]) as f:
            f.seek(mark)
            return f.read()
    except FileNotFoundError:
        return ""


class Rule:
    """asserts that the block logs exactly one violation line naming the call and the error"""
    def __init__(self, call, err):
        self.call, self.err = call, err

    def __enter__(self):
        self.mark = log_mark()
        return self

    def __exit__(self, *exc):
        if exc[0]:
            return False
        lines = [l for l in log_since(self.mark).splitlines() if l]
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"cuda-standin: {self.call}: ") and lines[0].endswith(f"-> {self.err}"), lines[0]
        self.line = lines[0]


@pytest.fixture(scope="module", autouse=True)
def primary():
    ctx = init(0)
    yield ctx


def in_thread(fn):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()))
    t.start()
    t.join()
    return box["r"]


# ------------------------------------------------------------------ init, devices, errors
def test_devices_and_attributes():
    n = C.c_int()
    ck(cu.cuDeviceGetCount(C.byref(n)))
    assert n.value == 2
    name = C.create_string_buffer(100)
    ck(cu.cuDeviceGetName(name, 100, 1))
    assert name.value == b"gpumemd stand-in device 1"
    total = SZ()
    ck(cu.cuDeviceTotalMem_v2(C.byref(total), 0))
    assert total.value == 8 << 30
    v = C.c_int()
    for attr, want in [(75, 9), (76, 0), (102, 1), (103, 1), (41, 1), (16, 132)]:
        ck(cu.cuDeviceGetAttribute(C.byref(v), attr, 0))
        assert v.value == want, attr
    ck(cu.cuDeviceGetAttribute(C.byref(v), 33, 1))
    assert v.value == 0x19
    with Rule("cuDeviceGetAttribute", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuDeviceGetAttribute(C.byref(v), 9999, 0) == INVALID_VALUE
    with Rule("cuDeviceGet", "CUDA_ERROR_INVALID_DEVICE"):
        assert cu.cuDeviceGet(C.byref(v), 2) == INVALID_DEVICE
    ck(cu.cuDriverGetVersion(C.byref(v)))
    assert v.value == 12040


def test_uuid_stable_across_processes_and_v2():
    u1, u2 = C.create_string_buffer(16), C.create_string_buffer(16)
    ck(cu.cuDeviceGetUuid(u1, 1))
    ck(cu.cuDeviceGetUuid_v2(u2, 1))
    assert u1.raw == u2.raw
    out, _ = ok("""
        ck(cu.cuInit(0)); u = C.create_string_buffer(16); ck(cu.cuDeviceGetUuid(u, 1)); print(u.raw.hex())""")
    assert out.strip() == u1.raw.hex()
    u0 = C.create_string_buffer(16)
    ck(cu.cuDeviceGetUuid(u0, 0))
    assert u0.raw != u1.raw
    out, _ = ok("""
        ck(cu.cuInit(0)); u = C.create_string_buffer(16); ck(cu.cuDeviceGetUuid(u, 1)); print(u.raw.hex())""",
                env={"CUDA_STANDIN_UUID_SEED": "other-node"})
    assert out.strip() != u1.raw.hex()


def test_error_strings():
    s = C.c_char_p()
    ck(cu.cuGetErrorName(1, C.byref(s)))
    assert s.value == b"CUDA_ERROR_INVALID_VALUE"
    ck(cu.cuGetErrorString(1, C.byref(s)))
    assert s.value == b"invalid argument"
    ck(cu.cuGetErrorString(700, C.byref(s)))
    assert s.value == b"an illegal memory access was encountered"
    ck(cu.cuGetErrorName(801, C.byref(s)))
    assert s.value == b"CUDA_ERROR_NOT_SUPPORTED"
    assert cu.cuGetErrorName(12345, C.byref(s)) == INVALID_VALUE


def test_not_initialized_and_no_device():
    _, err = ok("""
        n = C.c_int(); assert cu.cuDeviceGetCount(C.byref(n)) == 3
        d = U64(); assert cu.cuMemAlloc_v2(C.byref(d), 10) == 3""")
    assert "cuDeviceGetCount: called before cuInit -> CUDA_ERROR_NOT_INITIALIZED" in err
    ok("""
        assert cu.cuInit(0) == 100
        n = C.c_int(); assert cu.cuDeviceGetCount(C.byref(n)) == 3""", env={"CUDA_STANDIN_DEVICES": "0"})
    ok("assert cu.cuInit(0) == 100", env={"CUDA_STANDIN_DEVICES": ""})


def test_visible_devices():
    u1 = C.create_string_buffer(16)
    ck(cu.cuDeviceGetUuid(u1, 1))
    h = u1.raw.hex()
    uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    code = """
        ck(cu.cuInit(0)); n = C.c_int(); ck(cu.cuDeviceGetCount(C.byref(n))); names = []
        for i in range(n.value):
            b = C.create_string_buffer(64); ck(cu.cuDeviceGetName(b, 64, i)); names.append(b.value.decode()[-1])
        print(",".join(names))"""
    for vis, want in [("1", "1"), ("1,0", "1,0"), ("0,7,1", "0"), (uuid[:12], "1"), ("GPU-zz,0", ""), ("", ""), ("1,1", "1")]:
        env = {"CUDA_VISIBLE_DEVICES": vis}
        if want == "":
            ok("assert cu.cuInit(0) == 100", env=env)
        else:
            out, _ = ok(code, env=env)
            assert out.strip() == want, vis


# ------------------------------------------------------------------ contexts
def test_context_stack_and_no_context():
    cur = C.c_void_p()
    ck(cu.cuCtxGetCurrent(C.byref(cur)))
    main = cur.value
    c2 = C.c_void_p()
    ck(cu.cuCtxCreate_v2(C.byref(c2), 0, 1))
    d = C.c_int()
    ck(cu.cuCtxGetDevice(C.byref(d)))
    assert d.value == 1
    popped = C.c_void_p()
    ck(cu.cuCtxPopCurrent_v2(C.byref(popped)))
    assert popped.value == c2.value
    ck(cu.cuCtxGetCurrent(C.byref(cur)))
    assert cur.value == main
    ck(cu.cuCtxDestroy_v2(c2))
    with Rule("cuCtxPushCurrent_v2", "CUDA_ERROR_INVALID_CONTEXT"):
        assert cu.cuCtxPushCurrent_v2(c2) == INVALID_CONTEXT
    with Rule("cuCtxDestroy_v2", "CUDA_ERROR_INVALID_CONTEXT"):
        assert cu.cuCtxDestroy_v2(c2) == INVALID_CONTEXT

    def no_ctx():
        d = U64()
        f, t = SZ(), SZ()
        s = C.c_void_p()
        e = C.c_void_p()
        return (cu.cuMemAlloc_v2(C.byref(d), 16), cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)), cu.cuCtxSynchronize(),
                cu.cuStreamCreate(C.byref(s), 0), cu.cuEventCreate(C.byref(e), 0),
                cu.cuCtxPopCurrent_v2(C.byref(C.c_void_p())))
    mark = log_mark()
    assert in_thread(no_ctx) == (INVALID_CONTEXT,) * 6
    assert log_since(mark).count("-> CUDA_ERROR_INVALID_CONTEXT") == 6


def test_primary_context_release_invalidates():
    out, err = ok("""
        ctx = init(0); p = alloc(4096)
        fl, act = C.c_uint(), C.c_int(); ck(cu.cuDevicePrimaryCtxGetState(0, C.byref(fl), C.byref(act))); assert act.value == 1
        ck(cu.cuDevicePrimaryCtxRelease_v2(0))
        ck(cu.cuDevicePrimaryCtxGetState(0, C.byref(fl), C.byref(act))); assert act.value == 0
        d = U64(); assert cu.cuMemAlloc_v2(C.byref(d), 16) == 201
        assert cu.cuDevicePrimaryCtxRelease_v2(0) == 201
        ctx2 = init(0); assert ctx2.value == ctx.value
        assert cu.cuMemFree_v2(p) == 1   # freed with its context
        print("ok")""")
    assert "the current context was destroyed" in err


# ------------------------------------------------------------------ cuMemAlloc, copies, ranges, info
def test_alloc_copy_memset_range():
    p = alloc(10000)
    h2d(p, b"abcdef")
    assert d2h(p, 6) == b"abcdef"
    ck(cu.cuMemsetD8_v2(p + 2, 0x5A, 3))
    assert d2h(p, 6) == b"abZZZf"
    ck(cu.cuMemsetD32_v2(p + 8, 0x01020304, 2))
    assert d2h(p + 8, 8) == struct.pack("<II", 0x01020304, 0x01020304)
    q = alloc(100)
    ck(cu.cuMemcpyDtoD_v2(q, p, 6))
    assert cs.peek(q, 6) == b"abZZZf"
    base, size = U64(), SZ()
    ck(cu.cuMemGetAddressRange_v2(C.byref(base), C.byref(size), p + 5000))
    assert (base.value, size.value) == (p, 10000)
    with Rule("cuMemGetAddressRange_v2", "CUDA_ERROR_NOT_FOUND"):
        assert cu.cuMemGetAddressRange_v2(C.byref(base), C.byref(size), 0x1000) == NOT_FOUND
    with Rule("cuMemcpyHtoD_v2", "CUDA_ERROR_INVALID_VALUE"):   # runs past the end
        assert cu.cuMemcpyHtoD_v2(q + 90, C.create_string_buffer(20), 20) == INVALID_VALUE
    host = C.create_string_buffer(64)
    with Rule("cuMemcpyHtoD_v2", "CUDA_ERROR_INVALID_VALUE"):   # not device memory
        assert cu.cuMemcpyHtoD_v2(C.addressof(host), host, 8) == INVALID_VALUE
    with Rule("cuMemsetD8_v2", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemsetD8_v2(C.addressof(host), 0, 8) == INVALID_VALUE
    with Rule("cuMemsetD32_v2", "CUDA_ERROR_INVALID_VALUE"):    # misaligned
        assert cu.cuMemsetD32_v2(p + 1, 0, 1) == INVALID_VALUE
    with Rule("cuMemFree_v2", "CUDA_ERROR_INVALID_VALUE"):      # interior pointer
        assert cu.cuMemFree_v2(p + 8) == INVALID_VALUE
    ck(cu.cuMemFree_v2(p))
    ck(cu.cuMemFree_v2(q))
    with Rule("cuMemFree_v2", "CUDA_ERROR_INVALID_VALUE") as r:  # double free
        assert cu.cuMemFree_v2(p) == INVALID_VALUE
    assert "freed already" in r.line
    with Rule("cuMemcpyDtoH_v2", "CUDA_ERROR_INVALID_VALUE"):   # use after free
        assert cu.cuMemcpyDtoH_v2(host, p, 4) == INVALID_VALUE
    with Rule("cuMemAlloc_v2", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemAlloc_v2(C.byref(U64()), 0) == INVALID_VALUE


def test_pre_v2_entry_points_log():
    mark = log_mark()
    d = U64()
    ck(cu.cuMemAlloc(C.byref(d), 64))
    ck(cu.cuMemFree(d.value))
    text = log_since(mark)
    assert "cuMemAlloc: is the pre-v2 entry point (32-bit pointers); call cuMemAlloc_v2" in text
    assert "cuMemFree: is the pre-v2 entry point" in text


def test_mem_get_info_local():
    f0, t = mem_info()
    assert t == 8 << 30
    p = alloc(64 * MiB)
    f1, _ = mem_info()
    assert f0 - f1 == 64 * MiB
    ck(cu.cuMemFree_v2(p))
    assert mem_info()[0] == f0


def test_out_of_memory():
    ok("""
        init(0); p = alloc(3 * MiB)
        d = U64(); assert cu.cuMemAlloc_v2(C.byref(d), 2 * MiB) == 2
        assert cu.cuMemCreate(C.byref(d), 2 * MiB, C.byref(prop()), 0) == 2
        ck(cu.cuMemFree_v2(p)); q = alloc(4 * MiB)
        f, t = mem_info(); assert (f, t) == (0, 4 * MiB), (f, t)""", env={"CUDA_STANDIN_TOTAL_BYTES": str(4 * MiB)})


# ------------------------------------------------------------------ streams and events
def test_async_work_lands_later():
    p = alloc(4096)
    ck(cu.cuMemsetD8_v2(p, 0, 4096))
    s = stream()
    e = event(2)
    assert cu.cuEventQuery(e) == 0          # never recorded
    ck(cu.cuMemsetD8Async(p, 0x77, 100, s))
    ck(cu.cuEventRecord(e, s))
    assert cs.peek(p, 4) == b"\0" * 4       # not yet: it runs >= 20 ms after queueing
    assert cu.cuEventQuery(e) == NOT_READY
    assert cu.cuStreamQuery(s) == NOT_READY
    ck(cu.cuEventSynchronize(e))
    assert cs.peek(p, 4) == b"\x77" * 4
    assert cu.cuEventQuery(e) == 0 and cu.cuStreamQuery(s) == 0
    # async copies, in order
    buf = C.create_string_buffer(b"XYZW", 4)
    out = C.create_string_buffer(4)
    ck(cu.cuMemcpyHtoDAsync_v2(p, buf, 4, s))
    ck(cu.cuMemcpyDtoHAsync_v2(out, p, 4, s))
    ck(cu.cuStreamSynchronize(s))
    assert out.raw == b"XYZW"
    # a synchronous copy waits for the legacy default stream
    ck(cu.cuMemsetD8Async(p, 0x11, 4, None))
    assert d2h(p, 4) == b"\x11" * 4
    ck(cu.cuStreamDestroy_v2(s))
    ck(cu.cuEventDestroy_v2(e))
    ck(cu.cuMemFree_v2(p))


def test_destroyed_handles_are_poisoned():
    s = stream()
    e = event()
    ck(cu.cuStreamDestroy_v2(s))
    ck(cu.cuEventDestroy_v2(e))
    with Rule("cuEventQuery", "CUDA_ERROR_INVALID_HANDLE"):
        assert cu.cuEventQuery(e) == INVALID_HANDLE
    with Rule("cuEventRecord", "CUDA_ERROR_INVALID_HANDLE"):
        assert cu.cuEventRecord(e, None) == INVALID_HANDLE
    with Rule("cuStreamSynchronize", "CUDA_ERROR_INVALID_HANDLE"):
        assert cu.cuStreamSynchronize(s) == INVALID_HANDLE
    with Rule("cuEventDestroy_v2", "CUDA_ERROR_INVALID_HANDLE"):
        assert cu.cuEventDestroy_v2(e) == INVALID_HANDLE
    with Rule("cuStreamQuery", "CUDA_ERROR_INVALID_HANDLE"):
        assert cu.cuStreamQuery(C.c_void_p(0x1234)) == INVALID_HANDLE


def test_event_flags():
    e = C.c_void_p()
    with Rule("cuEventCreate", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuEventCreate(C.byref(e), 4) == INVALID_VALUE   # INTERPROCESS without DISABLE_TIMING
    plain = event(0)
    with Rule("cuIpcGetEventHandle", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuIpcGetEventHandle(C.byref(Ipc64()), plain) == INVALID_VALUE
    ck(cu.cuEventDestroy_v2(plain))


def test_host_func_and_stream_wait_event():
    gate = threading.Event()
    ran = []
    fn = HOSTFN(lambda _: (gate.wait(10), ran.append(1)))
    a, b = stream(), stream(1)
    e = event(2)
    p = alloc(64)
    ck(cu.cuMemsetD8_v2(p, 0, 64))
    ck(cu.cuLaunchHostFunc(a, C.cast(fn, C.c_void_p), None))
    ck(cu.cuEventRecord(e, a))
    ck(cu.cuStreamWaitEvent(b, e, 0))
    ck(cu.cuMemsetD8Async(p, 0x33, 8, b))
    time.sleep(0.15)
    assert cs.peek(p, 1) == b"\0", "work after a stream wait ran before the event completed"
    assert cu.cuEventQuery(e) == NOT_READY
    gate.set()
    ck(cu.cuStreamSynchronize(b))
    assert ran == [1] and cs.peek(p, 1) == b"\x33"
    # cuCtxSynchronize waits for every stream of the context
    ck(cu.cuMemsetD8Async(p, 0x44, 8, b))
    ck(cu.cuMemsetD8Async(p + 8, 0x55, 8, a))
    ck(cu.cuCtxSynchronize())
    assert cs.peek(p, 16) == b"\x44" * 8 + b"\x55" * 8
    for x in (a, b):
        ck(cu.cuStreamDestroy_v2(x))
    ck(cu.cuMemFree_v2(p))


def test_ipc_event_across_processes():
    gate = threading.Event()
    fn = HOSTFN(lambda _: gate.wait(20) and None)
    s = stream()
    e = event(2 | 4)
    h = Ipc64()
    ck(cu.cuIpcGetEventHandle(C.byref(h), e))
    with Rule("cuIpcOpenEventHandle", "CUDA_ERROR_INVALID_CONTEXT"):
        assert cu.cuIpcOpenEventHandle(C.byref(C.c_void_p()), h) == INVALID_CONTEXT
    child = spawn("""
        init(0); h = Ipc64(); C.memmove(C.addressof(h), bytes.fromhex(sys.stdin.readline()), 64)
        e = C.c_void_p(); ck(cu.cuIpcOpenEventHandle(C.byref(e), h), "open")
        print("q1", cu.cuEventQuery(e)); sys.stdin.readline()
        print("q2", cu.cuEventQuery(e)); ck(cu.cuEventSynchronize(e)); print("q3", cu.cuEventQuery(e))""", uid=NOBODY)
    child.stdin.write(bytes(h.reserved).hex() + "\n")
    child.stdin.flush()
    assert child.stdout.readline().split() == ["q1", "0"]      # never recorded
    ck(cu.cuLaunchHostFunc(s, C.cast(fn, C.c_void_p), None))
    ck(cu.cuEventRecord(e, s))
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().split() == ["q2", str(NOT_READY)]
    gate.set()
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert out.split() == ["q3", "0"]
    ck(cu.cuStreamSynchronize(s))
    ck(cu.cuEventDestroy_v2(e))
    ck(cu.cuStreamDestroy_v2(s))


# ------------------------------------------------------------------ legacy IPC
@pytest.mark.parametrize("uid", [None, NOBODY])
def test_legacy_ipc_across_processes(uid):
    p = alloc(3 * MiB)
    h2d(p, b"exported-bytes")
    handle = ipc_get(p)
    f_before, _ = mem_info()
    out, err = ok(f"""
        init(0); rc, d = ipc_open(bytes.fromhex("{handle.hex()}")); ck(rc, "open")
        assert d2h(d, 14) == b"exported-bytes"
        h2d(d + 100, b"from-importer")
        base, size = U64(), SZ(); ck(cu.cuMemGetAddressRange_v2(C.byref(base), C.byref(size), d + 5))
        assert (base.value, size.value) == (d, 3 * MiB)
        rc2, d2 = ipc_open(bytes.fromhex("{handle.hex()}")); assert rc2 == 0 and d2 == d  # refcounted
        print(mem_info()[0])
        assert cu.cuMemFree_v2(d) == 1                    # IPC memory is closed, not freed
        ck(cu.cuIpcCloseMemHandle(d)); ck(cu.cuIpcCloseMemHandle(d))
        assert cu.cuIpcCloseMemHandle(d) == 1
        """, uid=uid)
    assert "was opened with cuIpcOpenMemHandle; close it with cuIpcCloseMemHandle -> CUDA_ERROR_INVALID_VALUE" in err
    assert int(out.split()[0]) == f_before          # same allocation counted once node-wide
    assert cs.peek(p + 100, 13) == b"from-importer"
    ck(cu.cuMemFree_v2(p))
    _, _, err = run(f"""
        init(0); rc, d = ipc_open(bytes.fromhex("{handle.hex()}")); print(rc); assert rc == 1""", uid=uid)
    assert "cuIpcOpenMemHandle_v2: the exported allocation was freed" in err and err.strip().endswith("CUDA_ERROR_INVALID_VALUE")


def test_legacy_ipc_rules():
    p = alloc(4096)
    handle = ipc_get(p)
    with Rule("cuIpcOpenMemHandle_v2", "CUDA_ERROR_INVALID_CONTEXT"):   # own handle
        assert ipc_open(handle)[0] == INVALID_CONTEXT
    with Rule("cuIpcOpenMemHandle_v2", "CUDA_ERROR_INVALID_VALUE"):     # garbage
        assert ipc_open(b"\x42" * 64)[0] == INVALID_VALUE
    bad = bytearray(handle)
    bad[30] ^= 1
    with Rule("cuIpcOpenMemHandle_v2", "CUDA_ERROR_INVALID_VALUE"):     # tampered
        assert ipc_open(bytes(bad))[0] == INVALID_VALUE
    with Rule("cuIpcOpenMemHandle_v2", "CUDA_ERROR_INVALID_VALUE"):     # bad flags
        assert ipc_open(handle, flags=2)[0] == INVALID_VALUE
    with Rule("cuIpcGetMemHandle", "CUDA_ERROR_INVALID_VALUE"):         # not the base
        assert cu.cuIpcGetMemHandle(C.byref(Ipc64()), p + 16) == INVALID_VALUE
    with Rule("cuIpcCloseMemHandle", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuIpcCloseMemHandle(p) == INVALID_VALUE
    # another PID namespace
    r = subprocess.run(["unshare", "--pid", "--fork", PY, "-c", PRELUDE + textwrap.dedent(f"""
        init(0); rc, d = ipc_open(bytes.fromhex("{handle.hex()}")); print(rc)""")],
        env=dict(os.environ, PYTHONPATH=HERE, CUDA_STANDIN_LOG=""), capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "unshare" in r.stderr and "Operation not permitted" in r.stderr:
        pytest.skip("cannot create a PID namespace here")
    assert r.stdout.split() == ["1"], r.stderr
    assert "another PID namespace" in r.stderr
    ck(cu.cuMemFree_v2(p))


# ------------------------------------------------------------------ VMM
def test_vmm_local_and_rules():
    g = gran()
    assert g == 2 * MiB
    gr = SZ()
    assert cu.cuMemGetAllocationGranularity(C.byref(gr), C.byref(prop()), 1) == 0 and gr.value == g
    bad = prop()
    bad.type = 2
    with Rule("cuMemGetAllocationGranularity", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemGetAllocationGranularity(C.byref(gr), C.byref(bad), 0) == INVALID_VALUE
    h = U64()
    with Rule("cuMemCreate", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemCreate(C.byref(h), g + 4096, C.byref(prop()), 0) == INVALID_VALUE
    with Rule("cuMemCreate", "CUDA_ERROR_INVALID_DEVICE"):
        assert cu.cuMemCreate(C.byref(h), g, C.byref(prop(dev=5)), 0) == INVALID_DEVICE
    f0 = mem_info()[0]
    a = vmm_create(2 * g)
    assert mem_info()[0] == f0 - 2 * g
    pr = Prop()
    ck(cu.cuMemGetAllocationPropertiesFromHandle(C.byref(pr), a))
    assert (pr.type, pr.requestedHandleTypes, pr.location.id) == (1, 1, 0)
    va = U64()
    ck(cu.cuMemAddressReserve(C.byref(va), 4 * g, 0, 0, 0))
    v = va.value
    assert v % g == 0
    with Rule("cuMemAddressReserve", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemAddressReserve(C.byref(U64()), g + 1, 0, 0, 0) == INVALID_VALUE
    with Rule("cuMemMap", "CUDA_ERROR_INVALID_VALUE"):      # offset
        assert cu.cuMemMap(v, g, g, a, 0) == INVALID_VALUE
    with Rule("cuMemMap", "CUDA_ERROR_INVALID_VALUE"):      # not a granularity multiple
        assert cu.cuMemMap(v, g // 2, 0, a, 0) == INVALID_VALUE
    with Rule("cuMemMap", "CUDA_ERROR_INVALID_VALUE"):      # larger than the allocation
        assert cu.cuMemMap(v, 3 * g, 0, a, 0) == INVALID_VALUE
    with Rule("cuMemMap", "CUDA_ERROR_INVALID_VALUE"):      # past the reservation
        assert cu.cuMemMap(v + 3 * g, 2 * g, 0, a, 0) == INVALID_VALUE
    with Rule("cuMemMap", "CUDA_ERROR_INVALID_VALUE"):      # outside any reservation
        assert cu.cuMemMap(0x10000000, g, 0, a, 0) == INVALID_VALUE
    ck(cu.cuMemMap(v, 2 * g, 0, a, 0))
    with Rule("cuMemMap", "CUDA_ERROR_INVALID_VALUE"):      # over a mapped range
        assert cu.cuMemMap(v + g, 2 * g, 0, a, 0) == INVALID_VALUE
    # a mapping without access is inaccessible to the driver
    with Rule("cuMemsetD8_v2", "CUDA_ERROR_ILLEGAL_ADDRESS"):
        assert cu.cuMemsetD8_v2(v, 1, 16) == ILLEGAL_ADDRESS
    acc = access(3)
    with Rule("cuMemSetAccess", "CUDA_ERROR_INVALID_VALUE"):  # range not fully mapped
        assert cu.cuMemSetAccess(v, 3 * g, C.byref(acc), 1) == INVALID_VALUE
    with Rule("cuMemSetAccess", "CUDA_ERROR_INVALID_VALUE"):  # bad flags
        assert cu.cuMemSetAccess(v, 2 * g, C.byref(access(2)), 1) == INVALID_VALUE
    with Rule("cuMemSetAccess", "CUDA_ERROR_INVALID_DEVICE"):
        assert cu.cuMemSetAccess(v, 2 * g, C.byref(access(3, dev=9)), 1) == INVALID_DEVICE
    ck(cu.cuMemSetAccess(v, 2 * g, C.byref(acc), 1))
    h2d(v + g - 2, b"span")
    assert d2h(v + g - 2, 4) == b"span"
    fl = C.c_ulonglong()
    ck(cu.cuMemGetAccess(C.byref(fl), C.byref(Loc(1, 0)), v + 5))
    assert fl.value == 3
    base, size = U64(), SZ()
    ck(cu.cuMemGetAddressRange_v2(C.byref(base), C.byref(size), v + g))
    assert (base.value, size.value) == (v, 2 * g)
    # read-only: driver writes fault with ILLEGAL_ADDRESS, reads work
    ck(cu.cuMemSetAccess(v, 2 * g, C.byref(access(1)), 1))
    with Rule("cuMemcpyHtoD_v2", "CUDA_ERROR_ILLEGAL_ADDRESS"):
        assert cu.cuMemcpyHtoD_v2(v, C.create_string_buffer(4), 4) == ILLEGAL_ADDRESS
    with Rule("cuMemsetD8Async", "CUDA_ERROR_ILLEGAL_ADDRESS"):
        assert cu.cuMemsetD8Async(v, 0, 4, None) == ILLEGAL_ADDRESS
    assert d2h(v + g - 2, 4) == b"span"
    # release while mapped: still usable, still counted
    r = U64()
    ck(cu.cuMemRetainAllocationHandle(C.byref(r), C.c_void_p(v + 100)))
    assert r.value == a
    ck(cu.cuMemRelease(r.value))
    ck(cu.cuMemRelease(a))
    with Rule("cuMemRelease", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemRelease(a) == INVALID_VALUE
    assert d2h(v + g - 2, 4) == b"span" and mem_info()[0] == f0 - 2 * g
    with Rule("cuMemAddressFree", "CUDA_ERROR_INVALID_VALUE"):   # still mapped
        assert cu.cuMemAddressFree(v, 4 * g) == INVALID_VALUE
    with Rule("cuMemUnmap", "CUDA_ERROR_INVALID_VALUE"):         # part of a mapping
        assert cu.cuMemUnmap(v, g) == INVALID_VALUE
    ck(cu.cuMemUnmap(v, 2 * g))
    assert mem_info()[0] == f0                                   # freed at the last unmap
    with Rule("cuMemcpyDtoH_v2", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemcpyDtoH_v2(C.create_string_buffer(4), v, 4) == INVALID_VALUE
    with Rule("cuMemAddressFree", "CUDA_ERROR_INVALID_VALUE"):   # not the whole reservation
        assert cu.cuMemAddressFree(v, 2 * g) == INVALID_VALUE
    ck(cu.cuMemAddressFree(v, 4 * g))


def test_vmm_export_rules():
    g = gran()
    a = vmm_create(g, handle_types=0)
    fd = C.c_int()
    with Rule("cuMemExportToShareableHandle", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemExportToShareableHandle(C.byref(fd), a, 1, 0) == INVALID_VALUE
    ck(cu.cuMemRelease(a))
    b = vmm_create(g)
    f1, f2 = export_fd(b), export_fd(b)
    assert f1 != f2
    # importing does not consume the descriptor; importing in the same process is allowed
    h = import_fd(f1)
    os.fstat(f1)
    ck(cu.cuMemRelease(h))
    with open("/dev/null") as null:
        with Rule("cuMemImportFromShareableHandle", "CUDA_ERROR_INVALID_VALUE"):
            assert cu.cuMemImportFromShareableHandle(C.byref(U64()), C.c_void_p(null.fileno()), 1) == INVALID_VALUE
    mfd = os.memfd_create("not-a-standin")
    with Rule("cuMemImportFromShareableHandle", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemImportFromShareableHandle(C.byref(U64()), C.c_void_p(mfd), 1) == INVALID_VALUE
    with Rule("cuMemImportFromShareableHandle", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemImportFromShareableHandle(C.byref(U64()), C.c_void_p(9999), 1) == INVALID_VALUE
    for x in (f1, f2, mfd):
        os.close(x)
    ck(cu.cuMemRelease(b))


def test_vmm_disabled():
    out, err = ok("""
        init(0); v = C.c_int()
        ck(cu.cuDeviceGetAttribute(C.byref(v), 102, 0)); a = v.value
        ck(cu.cuDeviceGetAttribute(C.byref(v), 103, 0)); b = v.value
        h = U64(); print(a, b, cu.cuMemCreate(C.byref(h), 2 << 20, C.byref(prop()), 0))""", env={"CUDA_STANDIN_VMM": "0"})
    assert out.split() == ["0", "0", "801"]
    assert "cuMemCreate: virtual memory management is disabled (CUDA_STANDIN_VMM=0) -> CUDA_ERROR_NOT_SUPPORTED" in err


def test_cpu_write_to_read_only_mapping_faults():
    rc, out, err = run("""
        init(0); g = gran(); h = vmm_create(g); v = vmm_map(h, g, flags=1)
        print(C.string_at(v, 4).hex(), flush=True)
        C.memset(v, 1, 4)
        print("wrote", flush=True)""")
    assert rc == -signal.SIGSEGV, (rc, out, err)
    assert out.split() == ["00000000"]


@pytest.mark.parametrize("uid", [None, NOBODY])
def test_vmm_export_import_across_processes(uid):
    g = gran()
    h = vmm_create(2 * g)
    v = vmm_map(h, 2 * g)
    h2d(v, b"vmm-bytes")
    fd = export_fd(h)
    a, b = socket.socketpair()
    child = spawn(f"""
        init(0); s = socket.socket(fileno={b.fileno()})
        msg, fds, _, _ = socket.recv_fds(s, 16, 1)
        h = import_fd(fds[0]); v = vmm_map(h, {2 * g}, flags=1)
        assert d2h(v, 9) == b"vmm-bytes"
        out = C.c_int(-1)                                 # only what this process created exports
        assert cu.cuMemExportToShareableHandle(C.byref(out), h, 1, 0) == 1 and out.value == -1
        assert cu.cuMemsetD8_v2(v, 0, 4) == 700           # read-only mapping
        print("imported", mem_info()[0], flush=True)
        sys.stdin.readline()
        print(d2h(v, 9).decode(), flush=True)             # sees the exporter's later write
        vmm_unmap(v, {2 * g}); ck(cu.cuMemRelease(h))
        w = vmm_map(import_fd(fds[0]), {2 * g}, flags=3)   # fd still usable; re-import, writable
        h2d(w + 9, b"!"); print("done", flush=True)
        sys.stdin.readline()""", uid=uid, pass_fds=[b.fileno()])
    socket.send_fds(a, [b"x"], [fd])
    line = child.stdout.readline().split()
    assert line[0] == "imported", child.stderr.read()
    # released by the exporter but still mapped by the importer: still counted
    vmm_unmap(v, 2 * g)
    ck(cu.cuMemRelease(h))
    f_now = mem_info()[0]
    assert f_now == int(line[1])
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "vmm-bytes"
    assert child.stdout.readline().strip() == "done"
    m = mmap.mmap(fd, 2 * g)
    assert m[:10] == b"vmm-bytes!"
    m.close()
    child.stdin.write("\n")
    child.stdin.flush()
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert "-> CUDA_ERROR_ILLEGAL_ADDRESS" in err
    assert mem_info()[0] == f_now + 2 * g        # the importer exited: nothing holds it
    os.close(fd)
    a.close()
    b.close()


def test_async_fault_is_sticky():
    """queued work whose memory is unmapped before it runs faults the context, like a GPU"""
    c = C.c_void_p()
    ck(cu.cuCtxCreate_v2(C.byref(c), 0, 0))
    try:
        g = gran()
        h = vmm_create(g)
        v = vmm_map(h, g)
        s = stream()
        ck(cu.cuMemsetD8Async(v, 9, 16, s))
        vmm_unmap(v, g)
        ck(cu.cuMemRelease(h))
        mark = log_mark()
        assert cu.cuStreamSynchronize(s) == ILLEGAL_ADDRESS
        assert "cuMemsetD8Async: queued work ran after its memory changed under it" in log_since(mark)
        assert cu.cuMemAlloc_v2(C.byref(U64()), 16) == ILLEGAL_ADDRESS
    finally:
        ck(cu.cuCtxPopCurrent_v2(C.byref(C.c_void_p())))
        ck(cu.cuCtxDestroy_v2(c))
    p = alloc(16)   # the primary context is unaffected
    ck(cu.cuMemFree_v2(p))


# ------------------------------------------------------------------ node-wide ledger
def test_ledger_counts_other_processes_and_forgets_killed_ones():
    f0 = mem_info()[0]
    child = spawn("""
        init(0); p = alloc(100 << 20); g = gran(); h = vmm_create(4 * g)
        print("ready", flush=True); time.sleep(60)""")
    assert child.stdout.readline().strip() == "ready"
    assert mem_info()[0] == f0 - (100 << 20) - 8 * MiB
    # the other device is not affected
    ok(f"""
        init(1); assert mem_info()[0] == 8 << 30""")
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert mem_info()[0] == f0


def test_dead_process_files_are_swept(state_dir):
    d = os.path.join(state_dir, "state")
    before = set(os.listdir(d))
    child = spawn("""
        init(0); p = alloc(4096); e = event(6); h = Ipc64(); ck(cu.cuIpcGetEventHandle(C.byref(h), e))
        print("ready", flush=True); time.sleep(60)""")
    assert child.stdout.readline().strip() == "ready"
    new = set(os.listdir(d)) - before
    assert any(n.startswith("mem-") for n in new) and any(n.startswith("ev-") for n in new)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    ok("init(0)")     # cuInit of any process sweeps files of dead processes
    assert not (set(os.listdir(d)) & new)


# ------------------------------------------------------------------ more strict rules
def test_init_flags():
    with Rule("cuInit", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuInit(1) == INVALID_VALUE
    ok("assert cu.cuInit(0) == 100", env={"CUDA_VISIBLE_DEVICES": "MIG-abc,0"})


def test_stream_of_another_context():
    s = stream()
    c = C.c_void_p()
    ck(cu.cuCtxCreate_v2(C.byref(c), 0, 1))
    try:
        p = alloc(64)
        with Rule("cuMemsetD8Async", "CUDA_ERROR_INVALID_HANDLE"):
            assert cu.cuMemsetD8Async(p, 0, 8, s) == INVALID_HANDLE
        ck(cu.cuMemFree_v2(p))
    finally:
        ck(cu.cuCtxPopCurrent_v2(C.byref(C.c_void_p())))
        ck(cu.cuCtxDestroy_v2(c))
    ck(cu.cuStreamDestroy_v2(s))
    with Rule("cuStreamDestroy_v2", "CUDA_ERROR_INVALID_HANDLE"):
        assert cu.cuStreamDestroy_v2(None) == INVALID_HANDLE


def test_ipc_event_rules():
    e = event(6)
    h = Ipc64()
    ck(cu.cuIpcGetEventHandle(C.byref(h), e))
    hexh = bytes(h.reserved).hex()
    ck(cu.cuEventDestroy_v2(e))
    _, _, err = run(f"""
        init(0); h = Ipc64(); C.memmove(C.addressof(h), bytes.fromhex("{hexh}"), 64)
        e = C.c_void_p(); assert cu.cuIpcOpenEventHandle(C.byref(e), h) == 1
        g = Ipc64(); C.memmove(C.addressof(g), b"\\x07" * 64, 64)
        assert cu.cuIpcOpenEventHandle(C.byref(e), g) == 1""")
    assert "cuIpcOpenEventHandle: the exported event was destroyed" in err
    assert "cuIpcOpenEventHandle: the 64 bytes are not a handle from cuIpcGetEventHandle -> CUDA_ERROR_INVALID_VALUE" in err


def test_legacy_ipc_exporter_exited():
    out, _ = ok("""
        init(0); p = alloc(4096); print(ipc_get(p).hex())""")
    _, _, err = run(f"""
        init(0); rc, d = ipc_open(bytes.fromhex("{out.strip()}")); assert rc == 1, rc""")
    assert err.count("cuda-standin: cuIpcOpenMemHandle_v2:") == 1 and "-> CUDA_ERROR_INVALID_VALUE" in err


def test_vmm_import_on_invisible_device_and_after_release():
    g = gran()
    h = vmm_create(g, dev=1)
    fd = export_fd(h)
    ck(cu.cuMemRelease(h))          # the exported descriptor keeps the allocation alive
    a, b = socket.socketpair()
    socket.send_fds(a, [b"x"], [fd])
    _, _, err = run(f"""
        init(0); s = socket.socket(fileno={b.fileno()}); _, fds, _, _ = socket.recv_fds(s, 16, 1)
        h = U64(); assert cu.cuMemImportFromShareableHandle(C.byref(h), C.c_void_p(fds[0]), 1) == 101""",
                    env={"CUDA_VISIBLE_DEVICES": "0"}, pass_fds=[b.fileno()])
    assert "not visible to this process -> CUDA_ERROR_INVALID_DEVICE" in err
    socket.send_fds(a, [b"x"], [fd])
    ok(f"""
        init(1); s = socket.socket(fileno={b.fileno()}); _, fds, _, _ = socket.recv_fds(s, 16, 1)
        h = import_fd(fds[0]); v = vmm_map(h, {g}, dev=1); h2d(v, b"ok"); assert d2h(v, 2) == b"ok" """,
       pass_fds=[b.fileno()])
    for x in (fd, ):
        os.close(x)
    a.close()
    b.close()


def test_host_memory():
    pp = C.c_void_p()
    ck(cu.cuMemHostAlloc(C.byref(pp), 4096, 0))
    d = U64()
    ck(cu.cuMemHostGetDevicePointer_v2(C.byref(d), pp, 0))
    assert d.value == pp.value
    with Rule("cuMemHostRegister_v2", "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"):
        assert cu.cuMemHostRegister_v2(pp, 4096, 0) == 712
    ck(cu.cuMemFreeHost(pp))
    with Rule("cuMemFreeHost", "CUDA_ERROR_INVALID_VALUE"):
        assert cu.cuMemFreeHost(pp) == INVALID_VALUE
    buf = C.create_string_buffer(8192)
    ck(cu.cuMemHostRegister_v2(buf, 8192, 0))
    ck(cu.cuMemHostUnregister(buf))
    with Rule("cuMemHostUnregister", "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"):
        assert cu.cuMemHostUnregister(buf) == 713


def test_primary_context_reset():
    ok("""
        init(0); p = alloc(64); s = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(s), 0))
        ck(cu.cuDevicePrimaryCtxReset_v2(0))
        assert cu.cuMemFree_v2(p) == 1 and cu.cuStreamQuery(s) == 400
        q = alloc(64); ck(cu.cuMemFree_v2(q))""")


def test_jcuda_native_resolves_against_the_standin():
    jar = os.path.expanduser("~/.m2/repository/org/jcuda/jcuda-natives/12.0.0/jcuda-natives-12.0.0-linux-x86_64.jar")
    if not os.path.exists(jar):
        pytest.skip("JCuda natives jar not in ~/.m2")
    import tempfile
    import zipfile
    with tempfile.TemporaryDirectory() as t:
        with zipfile.ZipFile(jar) as z:
            so = z.extract("lib/libJCudaDriver-12.0.0-linux-x86_64.so", t)
        r = subprocess.run(["ldd", "-r", so], capture_output=True, text=True, env=os.environ)
    out = r.stdout + r.stderr
    lib = [l for l in out.splitlines() if "libcuda.so.1" in l]
    assert lib and "not found" not in lib[0], out
    cu_undefined = [l for l in out.splitlines() if "undefined symbol: cu" in l]
    assert not cu_undefined, cu_undefined[:5]
    with open(os.path.join(HERE, "..", "jcuda-symbols.txt")) as f:
        assert len(f.read().split()) == 307


def test_threads_share_the_driver(primary):
    errors = []

    def work(i):
        try:
            ck(cu.cuCtxSetCurrent(primary))
            s = stream(i % 2)
            e = event(2)
            for k in range(10):
                p = alloc(4096 + k)
                ck(cu.cuMemsetD8Async(p, (i + k) & 0xff, 4096, s))
                ck(cu.cuEventRecord(e, s))
                if k % 5 == 0:
                    ck(cu.cuEventSynchronize(e))
                    assert cs.peek(p, 4096) == bytes([(i + k) & 0xff]) * 4096
                ck(cu.cuMemFree_v2(p))   # synchronizes the context first
            ck(cu.cuStreamDestroy_v2(s))
            ck(cu.cuEventDestroy_v2(e))
        except Exception as x:  # noqa: BLE001
            errors.append(x)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors


def test_memset_async_option():
    ok("""
        init(0); p = alloc(64); h2d(p, b"\\0" * 64)
        ck(cu.cuMemsetD8_v2(p, 0x66, 64)); assert C.string_at(p, 1) == b"\\0"   # queued, not landed
        assert d2h(p, 1) == b"\\x66"   # a synchronous copy waits for the legacy stream""",
       env={"CUDA_STANDIN_MEMSET_ASYNC": "1", "CUDA_STANDIN_STREAM_DELAY_MS": "200"})


def test_legacy_ipc_one_context_per_device():
    p = alloc(4096)
    q = alloc(4096)
    h1, h2 = ipc_get(p).hex(), ipc_get(q).hex()
    _, err = ok(f"""
        init(0); rc, d = ipc_open(bytes.fromhex("{h1}")); ck(rc)
        c2 = C.c_void_p(); ck(cu.cuCtxCreate_v2(C.byref(c2), 0, 0))
        rc, _ = ipc_open(bytes.fromhex("{h2}")); assert rc == 201, rc      # same exporter, same device, other context
        ck(cu.cuCtxDestroy_v2(c2))
        ck(cu.cuCtxCreate_v2(C.byref(c2), 0, 1))                           # a context on another device may
        rc, d1 = ipc_open(bytes.fromhex("{h1}")); ck(rc); assert d1 != d
        ck(cu.cuIpcCloseMemHandle(d1)); ck(cu.cuCtxDestroy_v2(c2))
        ck(cu.cuIpcCloseMemHandle(d))""")
    assert err.count("only one context per device may open them) -> CUDA_ERROR_INVALID_CONTEXT") == 1
    ck(cu.cuMemFree_v2(p))
    ck(cu.cuMemFree_v2(q))
