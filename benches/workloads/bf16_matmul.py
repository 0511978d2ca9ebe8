"""bf16 8192^3 matmuls back to back: compute_bound on tensor cores."""
import torch
from common import DEV, loop

a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)


def step():
    for _ in range(8):
        torch.mm(a, b)
    torch.cuda.synchronize()


loop(step)
