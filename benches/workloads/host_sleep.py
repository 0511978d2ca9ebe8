"""Sleep 80 ms on the host between bursts of 40 bf16 matmuls: host_bound."""
import time

import torch
from common import DEV, loop

a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)


def step():
    time.sleep(0.08)
    for _ in range(40):
        torch.mm(a, a)
    torch.cuda.synchronize()


loop(step)
