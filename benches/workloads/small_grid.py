"""A one-thread spin kernel back to back (torch.cuda._sleep launches <<<1,1>>>): NVML reads 100%
utilised while one SM of all of them holds one warp: underfilled."""
import torch
from common import loop

torch.zeros(1, device="cuda:0")


def step():
    for _ in range(20):
        torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()


loop(step)
