"""A trainer (bf16 matmuls) beside a second process of the same job that holds 20 GiB and runs
nothing: `gpudiag run` must carry each process's SM and CPU share and name the idle holder.
Not one of benches/verdicts.py's single-bottleneck workloads: the GPU verdict is compute_bound."""
import multiprocessing as mp
import time

import torch
from common import DEV, SECONDS, loop


def hold(ready, seconds):
    held = torch.empty(20 * 1024**3, dtype=torch.uint8, device=DEV)
    torch.cuda.synchronize()
    ready.set()
    time.sleep(seconds)
    del held


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=hold, args=(ready, SECONDS + 2))
    holder.start()
    ready.wait()
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)

    def step():
        for _ in range(8):
            torch.mm(a, b)
        torch.cuda.synchronize()

    loop(step)
    holder.join()
