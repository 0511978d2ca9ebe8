#!/usr/bin/env python3
"""Side by side on one GPU: gpudiag's probe figures and the same operations through PyTorch.

Run from the repository root on the GPU host:  GPUDIAG_BIN=.gpu-bundle/gpudiag python3 benches/probes_vs_torch.py
Prints a table of ratios (gpudiag / PyTorch) and writes the raw numbers as JSON ($OUT or cwd).
Timing in PyTorch mirrors the probes: 16 ops between CUDA events after 4 warm-ups, median of
the samples; GB = 1e9; matmul on random data, median of 20 timed products after 2 warm-ups.
"""
import json, os, statistics, subprocess, sys, time

import torch

BIN = os.environ.get("GPUDIAG_BIN", "target/release/gpudiag")
SIZE = 1 << 30
N = 8192
VARIANTS = ["s4r", "s4", "k64s3", "k32s3", "k32s4"]


def timed(op, samples=5, copies=16, warm=4):
    for _ in range(warm):
        op()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(samples):
        s.record()
        for _ in range(copies):
            op()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def torch_numbers():
    r = {}
    a = torch.empty(SIZE, dtype=torch.uint8, device="cuda").fill_(0x5A)
    b = torch.empty_like(a)
    ms = timed(lambda: b.copy_(a))
    r["d2d_memcpy"] = SIZE * 16 / ms / 1e6
    h = torch.empty(SIZE, dtype=torch.uint8).pin_memory().fill_(0x5A)
    r["h2d_pinned"] = SIZE * 16 / timed(lambda: a.copy_(h, non_blocking=True)) / 1e6
    r["d2h_pinned"] = SIZE * 16 / timed(lambda: h.copy_(a, non_blocking=True)) / 1e6
    x = torch.empty(SIZE // 4, dtype=torch.float32, device="cuda").fill_(1.5)
    y = torch.empty_like(x).fill_(2.5)
    z = torch.empty_like(x)
    r["triad"] = 3 * SIZE * 16 / timed(lambda: torch.add(x, y, alpha=3.0, out=z)) / 1e6
    del a, b, h, x, y, z
    torch.cuda.empty_cache()
    cases = [("fp32", torch.float32, False, "randn"), ("tf32", torch.float32, True, "randn"),
             ("fp16", torch.float16, False, "randn"), ("bf16", torch.bfloat16, False, "randn")]
    # The same operations on gpudiag's kind of data (integers in [-64, 64] / 64), to separate
    # the effect of the data from that of the library call.
    cases += [(n + "_int64", dt, tf, "int") for n, dt, tf, _ in cases[1:]]
    for name, dt, tf32, kind in cases:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        if kind == "randn":
            A = torch.randn(N, N, device="cuda").to(dt)
            B = torch.randn(N, N, device="cuda").to(dt)
        else:
            A = (torch.randint(-64, 65, (N, N), device="cuda") / 64).to(dt)
            B = (torch.randint(-64, 65, (N, N), device="cuda") / 64).to(dt)
        for _ in range(2):
            A @ B
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(20):
            s.record(); A @ B; e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
        r[name] = 2 * N ** 3 / statistics.median(ts) / 1e9
        del A, B
    torch.cuda.empty_cache()
    return r


def gpudiag_numbers():
    t = time.time()
    out = subprocess.run([BIN, "probe", "bandwidth", "matmul", "--suite", "standard", "--json", "--device", "0"],
                         capture_output=True, text=True)
    wall = time.time() - t
    if not out.stdout:
        sys.exit(f"gpudiag failed: {out.stderr}")
    rep = json.loads(out.stdout)
    r = {"_wall_s": wall}
    for res in rep["devices"][0]["results"]:
        for m in res["metrics"]:
            r[m["name"]] = m["value"]
            r["_by_" + m["name"]] = m["served_by"]
        r["_verdict_" + res["probe"]] = res["verdict"]
    # Built-in kernel variants, driver-only (no cuBLAS): bf16 TFLOP/s of each.
    for v in VARIANTS:
        env = dict(os.environ, GPUDIAG_DRIVER_ONLY="1", GPUDIAG_MMA_VARIANT=v)
        o = subprocess.run([BIN, "probe", "matmul", "--suite", "standard", "--json", "--device", "0"],
                           capture_output=True, text=True, env=env)
        try:
            res = json.loads(o.stdout)["devices"][0]["results"][0]
            r["_builtin_" + v] = {m["name"]: m["value"] for m in res["metrics"]}
            r["_builtin_" + v]["verdict"] = res["verdict"]
        except (ValueError, KeyError, IndexError):
            r["_builtin_" + v] = o.stderr[-300:]
    t = time.time()
    chk = subprocess.run([BIN, "check", "--json", "--probes", "quick", "--device", "0"], capture_output=True, text=True)
    r["_check_quick_wall_s"] = time.time() - t
    r["_check_quick_exit"] = chk.returncode
    return r


def main():
    g = gpudiag_numbers()
    t = torch_numbers()
    rows = [
        ("D2D memcpy GB/s (copied)", g.get("d2d_memcpy"), t["d2d_memcpy"], 0.97),
        ("H2D pinned GB/s", g.get("h2d_pinned"), t["h2d_pinned"], 0.97),
        ("D2H pinned GB/s", g.get("d2h_pinned"), t["d2h_pinned"], 0.97),
        ("fp32 TFLOP/s", g.get("fp32"), t["fp32"], None),
        ("tf32 TFLOP/s", g.get("tf32"), t["tf32"], 0.97),
        ("fp16 TFLOP/s", g.get("fp16"), t["fp16"], 0.97),
        ("bf16 TFLOP/s", g.get("bf16"), t["bf16"], 0.97),
        ("triad GB/s (traffic) vs torch add", g.get("triad"), t["triad"], None),
    ]
    print(f"{'figure':<36} {'gpudiag':>10} {'pytorch':>10} {'ratio':>7} target")
    for name, a, b, target in rows:
        ratio = a / b if a and b else None
        ok = "" if target is None or ratio is None else ("ok" if ratio >= target else "MISS")
        print(f"{name:<36} {a or float('nan'):>10.1f} {b:>10.1f} {ratio or float('nan'):>7.3f} {'>= %.2f %s' % (target, ok) if target else ''}")
    memcpy = g.get("d2d_memcpy_traffic")
    default = g.get("_builtin_" + VARIANTS[0])
    fp16_builtin = default.get("fp16") if isinstance(default, dict) else None
    extra = [
        ("built-in bf16 / cuBLASLt bf16", g.get("bf16_builtin"), g.get("bf16"), 0.6),
        ("built-in fp16 / cuBLASLt fp16", fp16_builtin, g.get("fp16"), 0.6),
        ("copy kernel / memcpy (traffic)", g.get("d2d_kernel_traffic"), memcpy, None),
        ("triad / memcpy (traffic)", g.get("triad"), memcpy, None),
    ]
    for name, a, b, target in extra:
        ratio = a / b if a and b else None
        ok = "" if target is None or ratio is None else ("ok" if ratio >= target else "MISS")
        print(f"{name:<36} {a or float('nan'):>10.1f} {b or float('nan'):>10.1f} {ratio or float('nan'):>7.3f} {'>= %.2f %s' % (target, ok) if target else ''}")
    for n in ["tf32", "fp16", "bf16"]:
        print(f"pytorch {n}: randn {t[n]:.1f}, integers/64 {t[n + '_int64']:.1f} TFLOP/s; gpudiag/pytorch-on-integers {g.get(n, float('nan')) / t[n + '_int64']:.3f}")
    for v in VARIANTS:
        print(f"built-in variant {v} (driver-only): {g.get('_builtin_' + v)}")
    print(f"fp8 TFLOP/s (cuBLASLt): {g.get('fp8')}")
    print(f"check --probes quick: {g['_check_quick_wall_s']:.2f} s wall, exit {g['_check_quick_exit']} (target < 15 s)")
    print(f"probe bandwidth matmul --suite standard: {g['_wall_s']:.1f} s wall")
    print("served by:", {k[4:]: v for k, v in g.items() if k.startswith("_by_")})
    dest = os.environ.get("OUT", ".")
    with open(os.path.join(dest, "probes_vs_torch.json"), "w") as f:
        json.dump({"gpudiag": g, "torch": t, "device": torch.cuda.get_device_name(0)}, f, indent=1)


if __name__ == "__main__":
    main()
