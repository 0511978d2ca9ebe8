"""Shared by the bottleneck workloads: each runs one known bottleneck for SECONDS (argv[1],
default 20) on GPU 0, so `gpudiag run -- python3 benches/workloads/NAME.py` has a verdict to get
right. benches/verdicts.py runs them all and prints the table in benches/RESULTS.md."""
import sys
import time

import torch

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
DEV = torch.device("cuda:0")


def loop(step, seconds=SECONDS):
    """Calls step() until `seconds` have passed; synchronises at the end only."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        step()
    torch.cuda.synchronize()
