#!/usr/bin/env python3
"""Side-by-side: `gpudiag check --json --window 0` against `nvidia-smi -q` on a GPU host.

Runs each command alternately N times (after one warm-up each), measures wall time and the
child's peak RSS with os.wait4 (exact per child, no /usr/bin/time needed), and prints a
Markdown table with medians and the ratio gpudiag / nvidia-smi. Usage:

    python3 benches/check_vs_nvidia_smi.py [--gpudiag .gpu-bundle/gpudiag] [--runs 15]
"""
import argparse
import os
import statistics
import subprocess
import time


def run_once(cmd):
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024.0, proc.returncode, len(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpudiag", default=os.environ.get("GPUDIAG_BIN", ".gpu-bundle/gpudiag"))
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    cmds = {
        "gpudiag check --json --window 0": [args.gpudiag, "check", "--json", "--window", "0"],
        "nvidia-smi -q": ["nvidia-smi", "-q"],
    }
    results = {name: [] for name in cmds}
    for name, cmd in cmds.items():
        run_once(cmd)  # warm-up: page cache, driver state
    for _ in range(args.runs):
        for name, cmd in cmds.items():
            results[name].append(run_once(cmd))
    print(f"| command | runs | median wall (ms) | min wall (ms) | median peak RSS (MB) | output bytes | exit codes |")
    print("|---|---|---|---|---|---|---|")
    med = {}
    for name, rows in results.items():
        walls = [r[0] * 1000 for r in rows]
        rss = [r[1] for r in rows]
        codes = sorted({r[2] for r in rows})
        med[name] = (statistics.median(walls), statistics.median(rss))
        print(f"| `{name}` | {len(rows)} | {med[name][0]:.1f} | {min(walls):.1f} | "
              f"{med[name][1]:.1f} | {rows[-1][3]} | {codes} |")
    g, n = med["gpudiag check --json --window 0"], med["nvidia-smi -q"]
    print(f"\nratio gpudiag / nvidia-smi: wall {g[0] / n[0]:.2f}, peak RSS {g[1] / n[1]:.2f}")


if __name__ == "__main__":
    main()
