#!/usr/bin/env python3
"""gpudiag's p2p and nccl probes against PyTorch on the same host, in one run.

P2P: PyTorch cross-device `copy_` (copy engine, cudaMemcpyPeerAsync once peer access is on),
timed like gpudiag: 4 warm-ups, then samples of 16 copies, the median; GB = 1e9. Both
directions at once: one copy per direction on each sender's stream.
NCCL: torch.distributed all-reduce (NCCL backend, one process per GPU, float32 sum) for the
sizes of gpudiag's standard suite, timed the nccl-tests way (wall clock around the launches and
the final synchronise), bus bandwidth = algbw * 2(n-1)/n.

Each side runs twice, alternating, and the better run of each counts, so neither gains from
going second. Prints a markdown table; writes the raw figures to $OUT/multi_gpu.json.

    python3 benches/multi_gpu_vs_torch.py .gpu-bundle/gpudiag
"""
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

P2P_BYTES = 256 << 20  # standard suite
P2P_SAMPLES = 5
COPIES = 16
NCCL_SIZES = [8 << 20, 64 << 20, 256 << 20]
NCCL_WARMUPS, NCCL_ITERS = 5, 20


def sync_all(devs):
    for d in devs:
        torch.cuda.synchronize(d)


def torch_p2p():
    # In a child process: a CUDA context in this one would make gpudiag's guard refuse the
    # GPUs as busy on its second run.
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=p2p_worker, args=(q,))
    p.start()
    res = q.get(timeout=300)
    p.join()
    return res


def p2p_worker(q):
    n = torch.cuda.device_count()
    for a in range(n):
        for b in range(n):
            if a != b and torch.cuda.can_device_access_peer(a, b):
                # torch enables peer access on first use; make it happen before timing.
                torch.empty(1, device=f"cuda:{b}").copy_(torch.empty(1, device=f"cuda:{a}"))
    bufs = {d: (torch.full((P2P_BYTES,), d + 1, dtype=torch.uint8, device=f"cuda:{d}"),
                torch.empty(P2P_BYTES, dtype=torch.uint8, device=f"cuda:{d}")) for d in range(n)}
    out = {}
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            src, dst = bufs[s][0], bufs[d][1]
            for _ in range(4):
                dst.copy_(src, non_blocking=True)
            rates = []
            for _ in range(P2P_SAMPLES):
                sync_all([s, d])
                t0 = time.perf_counter()
                for _ in range(COPIES):
                    dst.copy_(src, non_blocking=True)
                sync_all([s, d])
                rates.append(COPIES * P2P_BYTES / (time.perf_counter() - t0) / 1e9)
            out[f"uni_{s}_{d}"] = statistics.median(rates)
    for a in range(n):
        for b in range(a + 1, n):
            sa, sb = torch.cuda.Stream(device=a), torch.cuda.Stream(device=b)
            rates = []
            for i in range(P2P_SAMPLES + 1):
                sync_all([a, b])
                t0 = time.perf_counter()
                for _ in range(COPIES):
                    with torch.cuda.stream(sa):
                        bufs[b][1].copy_(bufs[a][0], non_blocking=True)
                    with torch.cuda.stream(sb):
                        bufs[a][1].copy_(bufs[b][0], non_blocking=True)
                sync_all([a, b])
                if i > 0:  # the first round warms up
                    rates.append(2 * COPIES * P2P_BYTES / (time.perf_counter() - t0) / 1e9)
            out[f"bi_{a}_{b}"] = statistics.median(rates)
    q.put(out)


def nccl_worker(rank, world, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29517"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device(f"cuda:{rank}"))
    res = {}
    for size in NCCL_SIZES:
        x = torch.full((size // 4,), float(rank + 1), device=f"cuda:{rank}")
        for _ in range(NCCL_WARMUPS):
            y = x.clone()
            dist.all_reduce(y)
        torch.cuda.synchronize()
        dist.barrier()
        ys = [x.clone() for _ in range(NCCL_ITERS)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for y in ys:
            dist.all_reduce(y)
        torch.cuda.synchronize()
        t = (time.perf_counter() - t0) / NCCL_ITERS
        assert torch.all(ys[-1] == world * (world + 1) / 2)
        algbw = size / t / 1e9
        res[size] = {"algbw": algbw, "busbw": algbw * 2 * (world - 1) / world, "time_us": t * 1e6}
    if rank == 0:
        q.put(res)
    dist.destroy_process_group()


def torch_nccl():
    n = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=nccl_worker, args=(r, n, q)) for r in range(n)]
    for p in procs:
        p.start()
    res = q.get(timeout=300)
    for p in procs:
        p.join()
    return res


def gpudiag(binary):
    out = subprocess.run([binary, "probe", "p2p", "nccl", "--suite", "standard", "--json"],
                         capture_output=True, text=True, check=False)
    rep = json.loads(out.stdout)
    figs = {}
    for d in rep["devices"]:
        for r in d["results"]:
            if r["probe"] != "p2p":
                continue
            for link in r["details"].get("links", []):
                figs[f"uni_{link['src']}_{link['dst']}"] = link["unidirectional_gbps"]
                a, b = sorted((link["src"], link["dst"]))
                figs[f"bi_{a}_{b}"] = link["bidirectional_gbps"]
    for r in rep.get("host", []):
        for m in r["metrics"]:
            figs[m["name"]] = m["value"]
        figs["nccl_note"] = r.get("note")
        figs["nccl_verdict"] = r["verdict"]
    return figs, rep


def best(a, b):
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, (int, float)) and isinstance(out.get(k), (int, float)):
            out[k] = max(out[k], v)
        elif k not in out:
            out[k] = v
    return out


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else ".gpu-bundle/gpudiag"
    g1, rep = gpudiag(binary)
    t_p2p1, t_nccl1 = torch_p2p(), torch_nccl()
    g2, _ = gpudiag(binary)
    t_p2p2, t_nccl2 = torch_p2p(), torch_nccl()
    g = best(g1, g2)
    tp = best(t_p2p1, t_p2p2)
    tn = {s: {k: max(t_nccl1[s][k], t_nccl2[s][k]) if k != "time_us" else min(t_nccl1[s][k], t_nccl2[s][k])
              for k in t_nccl1[s]} for s in t_nccl1}
    print(f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    print("| figure | gpudiag | PyTorch | ratio |")
    print("|---|---|---|---|")
    for k in sorted(tp):
        if k in g and g[k]:
            print(f"| p2p {k} (GB/s) | {g[k]:.1f} | {tp[k]:.1f} | {g[k] / tp[k]:.3f} |")
    for s in NCCL_SIZES:
        gk = f"busbw_{s}"
        if gk in g:
            print(f"| all-reduce busbw {s >> 20} MiB (GB/s) | {g[gk]:.1f} | {tn[s]['busbw']:.1f} | "
                  f"{g[gk] / tn[s]['busbw']:.3f} |")
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "multi_gpu.json"), "w") as f:
        json.dump({"gpudiag": [g1, g2], "torch_p2p": [t_p2p1, t_p2p2],
                   "torch_nccl": [t_nccl1, t_nccl2], "gpudiag_report": rep}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
