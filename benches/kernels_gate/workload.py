"""Workloads of the `run --kernels` feasibility gate (benches/kernels_gate.sh).

    workload.py launch SECONDS     small elementwise kernels, one .item() a step (launch-heavy)
    workload.py matmul SECONDS     bf16 8192 matrix products
    workload.py copies SECONDS     pageable and pinned host-to-device copies
    workload.py profiler TRACE_DIR two torch.profiler sessions with unprofiled steps around them
    workload.py smoke              one tensor on the GPU (does the program still run?)

Prints one JSON line. With PROFILE_ALL=1, `launch` runs inside a torch.profiler session that
records CUDA activity only: Kineto's own cost on the same loop, the reference for ours.
"""

import json
import os
import sys
import time

import torch


def timed(step, seconds, warmup=1.0):
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step()
    torch.cuda.synchronize()
    steps = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        step()
        steps += 1
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - start)


def launch(seconds):
    x = torch.ones(1024, device="cuda")

    def step():
        y = x
        for _ in range(40):
            y = y * 1.0001 + 0.0001
        y.sum().item()

    if os.environ.get("PROFILE_ALL") == "1":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            rate = timed(step, seconds)
        events = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
        return {"steps_per_s": rate, "profiler_cuda_events": events}
    return {"steps_per_s": timed(step, seconds)}


def matmul(seconds):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return {"steps_per_s": timed(lambda: a @ b, seconds)}


def copies(seconds):
    pageable = torch.ones(4 << 20)
    pinned = torch.ones(4 << 20).pin_memory()

    def step():
        pageable.to("cuda")
        pinned.to("cuda", non_blocking=True)

    return {"steps_per_s": timed(step, seconds)}


def count_trace(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kinds = {}
    for e in events:
        cat = e.get("cat")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_sync"):
            kinds[cat] = kinds.get(cat, 0) + 1
    return kinds


def profiler(trace_dir):
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(2048, 2048, device="cuda")

    def step():
        b = a @ a
        (b + 1.0).sum().item()

    for _ in range(50):
        step()
    traces = []
    for session, steps in (("first", 20), ("second", 10)):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
        path = os.path.join(trace_dir, f"{os.getpid()}-{session}.json")
        prof.export_chrome_trace(path)
        traces.append({"session": session, "steps": steps, "events": count_trace(path)})
        for _ in range(50):
            step()
    torch.cuda.synchronize()
    return {"traces": traces, "unprofiled_steps": 150}


def main():
    mode = sys.argv[1]
    if mode == "launch":
        result = launch(float(sys.argv[2]))
    elif mode == "matmul":
        result = matmul(float(sys.argv[2]))
    elif mode == "copies":
        result = copies(float(sys.argv[2]))
    elif mode == "profiler":
        result = profiler(sys.argv[2])
    elif mode == "smoke":
        result = {"sum": float(torch.ones(3, device="cuda").sum().item())}
    else:
        raise SystemExit(f"unknown mode {mode}")
    result["mode"] = mode
    result["pid"] = os.getpid()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
