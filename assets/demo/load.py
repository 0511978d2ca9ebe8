#!/usr/bin/env python3
"""The load that made assets/demo/demo.ndjson.gz, run beside `gpudiag record` on a GPU host.

Phases (about 80 s): idle; bf16 matmuls at full load; pinned and pageable host-to-device copies
(PCIe traffic); many tiny kernels with a sync after each (a process holding memory while the GPU
mostly idles — the classic input-bound job); then idle again after freeing memory.
"""
import time

import torch


def phase(name, seconds):
    print(f"{time.strftime('%H:%M:%S')} {name} for {seconds} s", flush=True)
    return time.monotonic() + seconds


def main():
    dev = torch.device("cuda")
    end = phase("idle", 12)
    while time.monotonic() < end:
        time.sleep(0.1)

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    end = phase("matmul bf16 8192^3", 25)
    while time.monotonic() < end:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()

    host_pinned = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    host_pageable = torch.empty(1 << 30, dtype=torch.uint8)
    dst = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    end = phase("H2D copies, pinned then pageable", 12)
    half = end - 6
    while time.monotonic() < end:
        src = host_pinned if time.monotonic() < half else host_pageable
        dst.copy_(src, non_blocking=False)
    torch.cuda.synchronize()

    end = phase("tiny kernels with syncs (GPU mostly idle, memory held)", 15)
    x = torch.ones(1024, device=dev)
    while time.monotonic() < end:
        x.add_(1.0)
        torch.cuda.synchronize()
        time.sleep(0.002)

    del a, b, c, dst, x, host_pinned, host_pageable
    torch.cuda.empty_cache()
    end = phase("idle after freeing memory", 12)
    while time.monotonic() < end:
        time.sleep(0.1)
    print("done", flush=True)


if __name__ == "__main__":
    main()
