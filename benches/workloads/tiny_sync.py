"""Tiny kernels and an .item() each step: launch_bound or sync_bound."""
import torch
from common import DEV, loop

x = torch.randn(256, device=DEV)


def step():
    global x
    for _ in range(10):
        x = x * 1.0001 + 0.0001
    x.sum().item()


loop(step)
