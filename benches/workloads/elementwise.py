"""A large element-wise op (2 GiB in, 2 GiB out): memory_bound."""
import torch
from common import DEV, loop

x = torch.randn(512 * 1024 * 1024, device=DEV)
y = torch.empty_like(x)


def step():
    for _ in range(10):
        torch.mul(x, 1.0001, out=y)
    torch.cuda.synchronize()


loop(step)
