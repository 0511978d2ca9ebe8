#!/usr/bin/env python3
"""Where the memory of the prolog path goes: `gpudiag check --probes quick` on 1, 2, 4 (8) GPUs,
its wall time and peak resident memory (os.wait4: the kernel's own peak), and the mappings
that held the most at the sampled peak (/proc/PID/smaps every 20 ms, grouped by file: libcuda,
libcublasLt, libnvidia-ml, gpudiag itself, anonymous memory). Beside it, the floor: a bare
program that only initialises the driver and retains the same primary contexts (Python with
ctypes; Python's own RSS, printed as its own row, is part of that figure).

    python3 benches/prolog_rss.py --bin .gpu-bundle/gpudiag --gpus 1,2,4 \
        [--variant 'name=ENV=VALUE,ENV2=VALUE'] [--json-out FILE]

Prints Markdown tables. Variants run the same binary under other environment variables, e.g.
`no-cublaslt=GPUDIAG_DRIVER_ONLY=1` to see what loading cuBLASLt costs.
"""
import argparse
import collections
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

FLOOR = r"""
import ctypes, sys, time
n = int(sys.argv[1]); nvml = sys.argv[2] == "1"
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
if nvml:
    ml = ctypes.CDLL("libnvidia-ml.so.1"); assert ml.nvmlInit_v2() == 0
ctxs = []
for i in range(n):
    dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), i) == 0
    ctx = ctypes.c_void_p(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    ptr = ctypes.c_uint64(); assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20) == 0
    ctxs.append((dev, ctx))
time.sleep(0.3)
"""


def smaps_by_file(pid):
    """Rss in kB per mapped file (or [anon], [heap], [stack]) of `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            text = f.read()
    except OSError:
        return None
    out = collections.Counter()
    name = "[anon]"
    for line in text.splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" in head[3]:
            path = head[5] if len(head) == 6 else "[anon]"
            name = os.path.basename(path) if path.startswith("/") else path
            # Versioned libraries read as one: libcublasLt.so.13.0.0 -> libcublasLt.so
            if ".so" in name:
                name = name[: name.index(".so") + 3]
        elif line.startswith("Rss:"):
            out[name] += int(line.split()[1])
    return out


def measure(cmd, env, keep=None):
    start = time.perf_counter()
    out = open(keep, "wb") if keep else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env)
    peak = {"total": 0, "by_file": collections.Counter()}
    done = threading.Event()

    def sample():
        while not done.is_set():
            m = smaps_by_file(proc.pid)
            if m is None:
                return
            total = sum(m.values())
            if total > peak["total"]:
                peak["total"], peak["by_file"] = total, m
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    t.join()
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")[-400:]
    return {
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "sampled_peak_mb": round(peak["total"] / 1024, 1),
        "top": [(k, round(v / 1024, 1)) for k, v in peak["by_file"].most_common(8)],
        "exit": os.waitstatus_to_exitcode(status),
        "stderr_tail": err,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=".gpu-bundle/gpudiag")
    ap.add_argument("--label", default="", help="prefix of the variant names (which binary)")
    ap.add_argument("--gpus", default="1")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--json-out")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="leave out the bare-driver floor rows")
    ap.add_argument("--keep-reports", help="folder for each run's check report (stdout)")
    args = ap.parse_args()
    variants = [(args.label + "default", {})]
    for v in args.variant:
        name, _, pairs = v.partition("=")
        variants.append((args.label + name, dict(p.split("=", 1) for p in pairs.split(",") if p)))
    rows = []
    for n in [int(x) for x in args.gpus.split(",")]:
        devs = []
        for i in range(n):
            devs += ["--device", str(i)]
        for name, extra in variants:
            env = dict(os.environ, **extra)
            cmd = [args.bin, "check", "--probes", "quick", "--json", *devs]
            for run in range(args.runs):
                keep = None
                if args.keep_reports:
                    os.makedirs(args.keep_reports, exist_ok=True)
                    keep = os.path.join(args.keep_reports, f"{name}-{n}gpu-{run}.json")
                r = measure(cmd, env, keep)
                rows.append(dict(r, gpus=n, variant=name, run=run))
        for nvml in (0, 1) if args.floor else ():
            r = measure([sys.executable, "-c", FLOOR, str(n), str(nvml)], dict(os.environ))
            rows.append(dict(r, gpus=n, variant="floor: driver + contexts" + (" + NVML" if nvml else ""), run=0))
    if args.floor:
        rows.append(dict(measure([sys.executable, "-c", "pass"], dict(os.environ)), gpus=0,
                         variant="python alone (part of each floor row)", run=0))
    print("| GPUs | variant | run | wall (s) | peak RSS (MB) | exit | top mappings at the sampled peak (MB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        top = ", ".join(f"{k} {v}" for k, v in r["top"][:6])
        print(f"| {r['gpus']} | {r['variant']} | {r['run']} | {r['wall_s']} | {r['peak_rss_mb']} | {r['exit']} | {top} |")
    bad = [r for r in rows if r["exit"] not in (0, 1)]
    for r in bad:
        print(f"\nexit {r['exit']} ({r['variant']}, {r['gpus']} GPUs): {r['stderr_tail']}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
