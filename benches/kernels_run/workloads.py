"""Workloads for `gpudiag run --kernels` (issue 37), run by benches/kernels_run.sh on a GPU host.

    workloads.py MODE SECONDS

Modes, each a loop with a known shape on GPU 0:
  sync       tiny kernels and an .item() every step (sync-bound)
  launch     40 tiny element-wise kernels a step, one .item() every 50 steps (launch-bound)
  pageable   a 64 MiB pageable host-to-device copy, then a small kernel (copy-bound)
  resnet     timm ResNet-50 training, batch 64 (KRUN_BATCH), bf16 autocast, SGD (random data,
             no download)
  gpt2       HF GPT-2 (124M, random weights: no download) generate, batch 1, 32 new tokens
  profiler   two torch.profiler sessions between unprofiled steps (the user's own profiler)
  ddp_resnet timm ResNet-50 training under DistributedDataParallel, one process a GPU: run it
             under torchrun; batch KRUN_BATCH a rank; every rank runs the same number of steps
             (about 25 a second of SECONDS, or KRUN_DDP_STEPS); rank 0 prints

Prints one JSON line: steps a second, the mode, and the process's resident memory (now and at
its peak). With KRUN_STEP_LOG=FILE (rank 0 under DDP) FILE
gets the Unix time, in ns, at which each timed step returned (`steps_end_ns`, after `start_ns`):
benches/kernels_run/sampling_cost.py reads the cost of `--kernels=sample` from them, steps inside
the windows against steps outside, in the same process. With KRUN_UNDER_PROFILER=1 the timed loop
runs inside torch.profiler recording CUDA activity only (the reference for what recording costs). With TOP_OUT=FILE, the loop's last
few seconds run under torch.profiler and FILE gets the reference: the top kernels by
GPU time, the copies by kind, and the synchronisation calls with their counts.
"""

import contextlib
import json
import os
import sys
import time

import torch

DEV = torch.device("cuda:0")


def sync_mode():
    x = torch.randn(256, device=DEV)

    def step():
        nonlocal x
        for _ in range(10):
            x = x * 1.0001 + 0.0001
        x.sum().item()

    return step


def launch_mode():
    x = torch.ones(1024, device=DEV)
    count = [0]

    def step():
        y = x
        for _ in range(40):
            y = y * 1.0001 + 0.0001
        count[0] += 1
        if count[0] % 50 == 0:
            y.sum().item()

    return step


def pageable_mode():
    host = torch.randn(16 * 1024 * 1024)  # 64 MiB of fp32, not pinned
    small = torch.randn(1024, device=DEV)

    def step():
        y = host.to(DEV)
        (small * 2.0).sum()
        del y

    return step


def under_profiler():
    """torch.profiler recording CUDA activity only where KRUN_UNDER_PROFILER=1 (the reference for
    what recording costs), else nothing."""
    if os.environ.get("KRUN_UNDER_PROFILER") == "1":
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CUDA])
    return contextlib.nullcontext()


def resnet_step(dev=DEV, wrap=lambda model: model):
    """One training step of timm ResNet-50 on `dev` (bf16 autocast, SGD, batch KRUN_BATCH of
    random data); `wrap` puts the model in DistributedDataParallel for the DDP mode."""
    import timm

    model = wrap(timm.create_model("resnet50", pretrained=False).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = int(os.environ.get("KRUN_BATCH", "64"))
    data = torch.randn(batch, 3, 224, 224, device=dev)
    labels = torch.randint(0, 1000, (batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(data), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def resnet_mode():
    return resnet_step()


def gpt2_mode():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).to(DEV).eval()
    prompt = torch.randint(0, 50257, (1, 16), device=DEV)

    def step():
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                           pad_token_id=0)

    return step


def ddp_resnet_mode(seconds):
    """DDP training steps a second, measured by rank 0 over a count every rank agrees on (a
    time limit each would leave one rank waiting in an all-reduce the others never join)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    step = resnet_step(dev, lambda model: DistributedDataParallel(model, device_ids=[rank]))

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    under = under_profiler()
    under.__enter__()
    steps = int(os.environ.get("KRUN_DDP_STEPS", max(10, int(seconds * 25))))
    dist.barrier()
    torch.cuda.synchronize()
    log = StepLog() if rank == 0 else None
    start = time.perf_counter()
    if log:
        log.start()
    for _ in range(steps):
        step()
        if log:
            log.step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    under.__exit__(None, None, None)
    if log:
        log.write("ddp_resnet")
    dist.barrier()
    dist.destroy_process_group()
    return {"steps_per_s": steps / elapsed, "steps": steps, "rank": rank}


class StepLog:
    """When each timed step returned, on the Unix clock the collector's windows follow."""

    def __init__(self):
        self.path = os.environ.get("KRUN_STEP_LOG")
        self.start_ns = None
        self.ends = []

    def start(self):
        self.start_ns = time.time_ns()

    def step(self):
        if self.path:
            self.ends.append(time.time_ns())

    def write(self, mode):
        if self.path:
            with open(self.path, "w") as f:
                json.dump({"mode": mode, "pid": os.getpid(), "start_ns": self.start_ns,
                           "steps_end_ns": self.ends}, f)


def reference(step, seconds, path):
    """What torch.profiler names as the top kernels, copies and syncs of the same loop."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            step()
        torch.cuda.synchronize()
    trace = path + ".trace.json"
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    kernels, copies, syncs = {}, {}, {}
    for e in events:
        cat, name, dur = e.get("cat"), e.get("name", ""), float(e.get("dur", 0))
        table = {"kernel": kernels, "gpu_memcpy": copies, "gpu_memset": copies,
                 "cuda_sync": syncs}.get(cat)
        if cat == "cuda_runtime" and "ynchronize" in name:
            table = syncs
        if table is None:
            continue
        count, total = table.get(name, (0, 0.0))
        table[name] = (count + 1, total + dur)

    def top(table, n=10):
        rows = sorted(table.items(), key=lambda kv: -kv[1][1])[:n]
        return [{"name": k, "count": c, "total_us": round(t, 1)} for k, (c, t) in rows]

    with open(path, "w") as f:
        json.dump({"seconds": seconds, "kernels": top(kernels), "copies": top(copies),
                   "syncs": top(syncs), "kernel_count": sum(c for c, _ in kernels.values())}, f)
    os.remove(trace)


def count_trace(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kinds = {}
    for e in events:
        cat = e.get("cat")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_sync"):
            kinds[cat] = kinds.get(cat, 0) + 1
    return kinds


def profiler_mode(trace_dir):
    """The user's own torch.profiler in the command: both traces must stay whole."""
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(2048, 2048, device=DEV)

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


def host_memory():
    """This process's resident memory now and at its peak, MB (what the collector adds to a
    traced process: the issue's budget is 64 MB)."""
    import resource

    out = {"rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


def main():
    mode = sys.argv[1]
    if mode == "profiler":
        result = profiler_mode(sys.argv[2])
    elif mode == "ddp_resnet":
        result = ddp_resnet_mode(float(sys.argv[2]) if len(sys.argv) > 2 else 10.0)
        if result["rank"] != 0:
            return
    else:
        seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
        step = {"sync": sync_mode, "launch": launch_mode, "pageable": pageable_mode,
                "resnet": resnet_mode, "gpt2": gpt2_mode}[mode]()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        under = under_profiler()
        under.__enter__()
        warm_end = time.perf_counter() + min(2.0, seconds / 4)
        while time.perf_counter() < warm_end:
            step()
        torch.cuda.synchronize()
        log = StepLog()
        steps, start = 0, time.perf_counter()
        log.start()
        end = start + seconds
        while time.perf_counter() < end:
            step()
            log.step()
            steps += 1
        torch.cuda.synchronize()
        result = {"steps_per_s": steps / (time.perf_counter() - start), "steps": steps}
        # Out of the timed span: Kineto's processing of its records at the end.
        under.__exit__(None, None, None)
        log.write(mode)
        top_out = os.environ.get("TOP_OUT")
        if top_out:
            reference(step, min(3.0, seconds), top_out)
    result["mode"] = mode
    result["pid"] = os.getpid()
    result.update(host_memory())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
