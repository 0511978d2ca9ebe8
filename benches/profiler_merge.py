#!/usr/bin/env python3
"""A small PyTorch training loop profiled with torch.profiler, with a deliberate host-side pause
in the middle: the workload behind `gpudiag trace --merge` and `gpudiag run --profiler-trace`,
and the source of the merge fixtures in tests/fixtures/profiler/.

The loop trains a small MLP on GPU DEVICE for BUSY seconds, synchronises, sleeps PAUSE seconds
(the GPU idles, the host waits), then trains BUSY seconds more. The pause's wall-clock edges
(time.time_ns(), taken right after the synchronise and right after the sleep) go to a side file,
together with the torch version, so a checker can see where the GPU's own tracks must drop and
come back. The pause also appears in the trace as a `gpudiag_pause` user annotation, which
checks the clock alignment (baseTimeNanoseconds / 1000 + ts against time.time_ns()).

    python3 benches/profiler_merge.py --mode json --out OUTDIR
        writes OUTDIR/trace.json (prof.export_chrome_trace) and OUTDIR/pause.json
    python3 benches/profiler_merge.py --mode tensorboard --out OUTDIR
        writes OUTDIR/<host>_<pid>.<time>.pt.trace.json.gz (tensorboard_trace_handler, gzip) and
        OUTDIR/pause.json

On the GPU host (gpudiag binary built on the CPU machine and copied over as ./gpudiag):

    # 1. recording in the background, profiler trace written by export_chrome_trace
    mkdir -p /tmp/pm && ./gpudiag record -o /tmp/pm/rec.ndjson.gz --interval 100ms --force &
    REC=$!; sleep 2
    python3 benches/profiler_merge.py --mode json --out /tmp/pm
    sleep 2; kill -INT $REC; wait $REC
    ./gpudiag trace --merge /tmp/pm/trace.json --replay /tmp/pm/rec.ndjson.gz -o /tmp/pm/merged.json --force
    python3 benches/profiler_merge_check.py /tmp/pm/merged.json /tmp/pm/pause.json --interval 100ms

    # 2. one command: gpudiag records, the TensorBoard handler writes into /tmp/pm-tb
    mkdir -p /tmp/pm-tb && ./gpudiag run --interval 100ms --record /tmp/pm-tb/rec.ndjson.gz \\
        --profiler-trace /tmp/pm-tb --trace /tmp/pm-tb/merged.json --force -- \\
        python3 benches/profiler_merge.py --mode tensorboard --out /tmp/pm-tb
    python3 benches/profiler_merge_check.py /tmp/pm-tb/merged.json /tmp/pm-tb/pause.json --interval 100ms

The defaults keep the trace small (a few MB of JSON, well under 1 MB gzipped): record_shapes,
stacks and memory profiling are off and each busy half stops after MAX_STEPS steps.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch


def train_for(model, opt, data, target, seconds, max_steps):
    """Train until `seconds` have passed or `max_steps` steps ran; returns the step count."""
    loss_fn = torch.nn.MSELoss()
    deadline = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < deadline and steps < max_steps:
        with torch.profiler.record_function("train_step"):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(data), target)
            loss.backward()
            opt.step()
        steps += 1
        # One host sync every few steps, as a logging loop would; it keeps the host from
        # queueing seconds of work ahead of the GPU, so the busy time is where it looks.
        if steps % 4 == 0:
            loss.item()
    torch.cuda.synchronize()
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["json", "tensorboard"], required=True)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--busy", type=float, default=3.0, help="seconds of training each side")
    ap.add_argument("--pause", type=float, default=2.0, help="seconds of host-side sleep")
    ap.add_argument("--max-steps", type=int, default=150, help="step cap per busy half")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8192)
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    h = args.hidden
    model = torch.nn.Sequential(
        torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, h),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = torch.randn(args.batch, h, device=dev)
    target = torch.randn(args.batch, h, device=dev)
    # Warm-up outside the profiler: the CUDA context, cuBLAS handles and the first kernels' load
    # would otherwise sit at the start of the trace as one long odd step.
    train_for(model, opt, data, target, 0.5, 10)

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    handler = None
    if args.mode == "tensorboard":
        handler = torch.profiler.tensorboard_trace_handler(args.out, use_gzip=True)
    prof = torch.profiler.profile(
        activities=activities,
        record_shapes=False,
        with_stack=False,
        profile_memory=False,
        on_trace_ready=handler,
    )
    started_ns = time.time_ns()
    with prof:
        before = train_for(model, opt, data, target, args.busy, args.max_steps)
        # Clock readings on both sides of the annotation's own edges: entering and leaving a
        # record_function under the profiler takes tens of microseconds, so the annotation's
        # start lies between enter_ns and pause_start_ns, and its end between pause_end_ns and
        # exit_ns; the checker allows its tolerance outside those brackets only.
        enter_ns = time.time_ns()
        with torch.profiler.record_function("gpudiag_pause"):
            pause_start_ns = time.time_ns()
            time.sleep(args.pause)
            pause_end_ns = time.time_ns()
        exit_ns = time.time_ns()
        after = train_for(model, opt, data, target, args.busy, args.max_steps)
    finished_ns = time.time_ns()

    trace = None
    if args.mode == "json":
        trace = os.path.join(args.out, "trace.json")
        prof.export_chrome_trace(trace)
    side = {
        "pause_start_ns": pause_start_ns,
        "pause_end_ns": pause_end_ns,
        "annotation_enter_ns": enter_ns,
        "annotation_exit_ns": exit_ns,
        "profile_start_ns": started_ns,
        "profile_end_ns": finished_ns,
        "steps_before": before,
        "steps_after": after,
        "device": args.device,
        "gpu": torch.cuda.get_device_name(dev),
        "mode": args.mode,
        "trace": trace,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    with open(os.path.join(args.out, "pause.json"), "w") as f:
        json.dump(side, f, indent=2)
    print(json.dumps(side), file=sys.stderr)


if __name__ == "__main__":
    main()
