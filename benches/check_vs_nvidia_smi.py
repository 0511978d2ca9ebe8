#!/usr/bin/env python3
"""Side-by-side: `gpudiag check --json --window 0` against `nvidia-smi -q` on a GPU host.

Runs each command alternately N times (after one warm-up each), measures wall time and the
child's peak RSS with os.wait4 (exact per child, no /usr/bin/time needed), and prints a
Markdown table with medians and the ratio gpudiag / nvidia-smi. Usage:

    python3 benches/check_vs_nvidia_smi.py [--gpudiag .gpu-bundle/gpudiag] [--runs 15] [--phases]

--phases runs gpudiag three more times with GPUDIAG_TICK_STATS and prints, for the median of
them, when each phase of the check ended (wall and CPU since start, resident memory), the driver
calls made and each thread's CPU time: where the wall time goes.
"""
import argparse
import json
import os
import tempfile
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
    ap.add_argument("--phases", action="store_true",
                    help="also print gpudiag's own phase timings (GPUDIAG_TICK_STATS)")
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
    if args.phases:
        phases(cmds["gpudiag check --json --window 0"])


def phases(cmd):
    """Three runs with GPUDIAG_TICK_STATS; prints the one of median wall time."""
    runs = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(3):
            path = os.path.join(d, f"stats{i}.json")
            env = dict(os.environ, GPUDIAG_TICK_STATS=path)
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            try:
                with open(path) as f:
                    runs.append(json.load(f))
            except (OSError, ValueError) as e:
                print(f"(no stats from run {i}: {e})")
    if not runs:
        return
    runs.sort(key=lambda r: r["wall_s"])
    st = runs[len(runs) // 2]
    print(f"\ngpudiag's own phases (GPUDIAG_TICK_STATS, median of {len(runs)} runs by wall time; "
          f"times from its own start, after the process was loaded):\n")
    print("| phase ended | wall (ms) | CPU user+sys (ms) | RSS (MB) |")
    print("|---|---|---|---|")
    for m in st.get("marks", []):
        rss = m.get("rss_kb")
        print(f"| {m['name']} | {m['wall_s'] * 1000:.1f} | "
              f"{(m['cpu_user_s'] + m['cpu_system_s']) * 1000:.1f} | "
              f"{'n/a' if rss is None else f'{rss / 1024:.1f}'} |")
    c = st["counters"]
    print(f"| exit | {st['wall_s'] * 1000:.1f} | "
          f"{(st['cpu_user_s'] + st['cpu_system_s']) * 1000:.1f} | "
          f"peak {st['memory_kb'].get('VmHWM', 0) / 1024:.1f} |")
    print(f"\ndriver calls: {c.get('nvml_fast_calls')} fast, {c.get('gpm_samples')} GPM samples, "
          f"{c.get('nvml_slow_calls')} slow in {c.get('slow_rounds')} rounds "
          f"({c.get('slow_round_ns', 0) / 1e6:.1f} ms), poll {c.get('poll_ns', 0) / 1e6:.1f} ms; "
          f"{c.get('allocs')} allocations ({c.get('alloc_bytes', 0) / 1024:.0f} KiB)")
    for n, g in st.get("call_groups", {}).items():
        if g["calls"]:
            print(f"- {n}: {g['calls']} calls, {g['wall_ms']:.2f} ms wall, "
                  f"{g['cpu_ms']:.2f} ms CPU of the calling thread")
    threads = sorted(st.get("threads", {}).items(),
                     key=lambda kv: -(kv[1]["user_s"] + kv[1]["system_s"]))
    print("threads alive at exit (CPU s): " + ", ".join(
        f"{name} {t['user_s'] + t['system_s']:.3f}" for name, t in threads))


if __name__ == "__main__":
    main()
