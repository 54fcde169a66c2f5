"""Second processes for test_alloc_gpu.py (PyTorch on a GPU).

`alloc_gpu_worker.py read TARGET TOKEN OFFSET COUNT`: attaches the share token, reads COUNT
float32 at OFFSET bytes into the block as a PyTorch tensor, prints `sum SUM first LAST`.
`alloc_gpu_worker.py hold TARGET BYTES`: allocates BYTES in a gpumemd MemPool, prints
`ready SESSION_ID`, then sleeps until killed."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gpumemd  # noqa: E402
import gpumemd.torch  # noqa: E402


def read(target, token, offset, count):
    offset, count = int(offset), int(count)
    with gpumemd.connect(target, client_name="alloc-gpu-reader") as gm:
        with gm.attach(token) as hold:
            raw = torch.as_tensor(hold, device="cuda")
            values = raw[offset:offset + 4 * count].view(torch.float32)
            print("sum %r first %r last %r" % (float(values.double().sum()), float(values[0]), float(values[-1])),
                  flush=True)
            del raw, values
            torch.cuda.synchronize()


def hold(target, size):
    gm = gpumemd.connect(target, client_name="alloc-gpu-holder")
    pool = gpumemd.torch.mem_pool(gm, 0)
    with torch.cuda.use_mem_pool(pool):
        kept = torch.ones(int(size) // 4, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    print("ready %s %d" % (gm.session_id, kept.numel()), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    mode = sys.argv[1]
    sys.exit({"read": read, "hold": hold}[mode](*sys.argv[2:]))
