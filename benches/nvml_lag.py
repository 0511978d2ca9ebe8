#!/usr/bin/env python3
"""How late NVML's own utilisation and the GPM SM-activity counter see the GPU stop and start,
read through NVIDIA's Python bindings with no gpudiag involved: the floor under any monitor's
timing, against which gpudiag's tracks on a merged profiler trace are judged.

A thread reads nvmlDeviceGetUtilizationRates every 10 ms and a GPM sample every 100 ms (SM
activity between consecutive samples), each stamped with time.time_ns() after the call. The main
thread runs bf16 matmuls for BUSY seconds, synchronises, notes the time, sleeps PAUSE seconds,
notes the time, and runs matmuls again. Prints, for each source, how long after the pause's
start the first idle reading (< 5%) came, and after its end the first busy one (>= 50%).

    python3 benches/nvml_lag.py [--busy 2] [--pause 2] [--repeats 3]
"""
import argparse
import threading
import time

import pynvml as N
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", type=float, default=2.0)
    ap.add_argument("--pause", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    util, gpm = [], []
    stop = threading.Event()

    def poll_util():
        while not stop.is_set():
            v = N.nvmlDeviceGetUtilizationRates(h).gpu
            util.append((time.time_ns(), v))
            time.sleep(0.01)

    def poll_gpm():
        a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
        N.nvmlGpmSampleGet(h, a)
        while not stop.wait(0.1):
            N.nvmlGpmSampleGet(h, b)
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version = N.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = a, b
            mg.metrics[0].metricId = N.NVML_GPM_METRIC_SM_UTIL
            N.nvmlGpmMetricsGet(mg)
            gpm.append((time.time_ns(), mg.metrics[0].value))
            a, b = b, a

    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def busy(seconds):
        end = time.time() + seconds
        while time.time() < end:
            for _ in range(8):
                x @ x
            torch.cuda.synchronize()

    busy(0.5)
    threads = [threading.Thread(target=poll_util, daemon=True), threading.Thread(target=poll_gpm, daemon=True)]
    for t in threads:
        t.start()
    pauses = []
    for _ in range(args.repeats):
        busy(args.busy)
        p0 = time.time_ns()
        time.sleep(args.pause)
        p1 = time.time_ns()
        pauses.append((p0, p1))
    busy(args.busy)
    stop.set()
    for t in threads:
        t.join()

    print(f"{'source':<34} {'pause':>5} {'idle seen after start (ms)':>27} {'busy seen after end (ms)':>25}")
    for name, series in (("NVML utilisation, read every 10 ms", util), ("GPM SM activity, sampled every 100 ms", gpm)):
        for i, (p0, p1) in enumerate(pauses):
            drop = next((t for t, v in series if t >= p0 and v < 5), None)
            rise = next((t for t, v in series if t >= p1 and v >= 50), None)
            fmt = lambda t, ref: "never" if t is None else f"{(t - ref) / 1e6:.0f}"
            print(f"{name:<34} {i:>5} {fmt(drop, p0):>27} {fmt(rise, p1):>25}")


if __name__ == "__main__":
    main()
