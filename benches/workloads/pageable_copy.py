"""A pageable (unpinned) 256 MiB host-to-device copy each step: copy_bound."""
import torch
from common import DEV, loop

host = torch.randn(64 * 1024 * 1024)  # 256 MiB of fp32, not pinned


def step():
    host.to(DEV)
    torch.cuda.synchronize()


loop(step)
