#!/usr/bin/env python3
"""Soak: `gpudiag record` at 50 ms for a long stretch, watching its resident memory and the
file's growth for leaks.

Samples the recorder's VmRSS and the file size every 10 s. The history the rules judge keeps raw
points for 10 minutes (then 10-second buckets), so RSS is meant to climb for the first 10
minutes at 50 ms and then stay flat: a leak shows as RSS still climbing after that (fitted from
`--flat-after`, default 630 s) or as bytes per minute growing over time. At the end the file is
replayed with `check --replay --json`: it must parse and hold about one tick per 50 ms.

    python3 benches/soak.py .gpu-bundle/gpudiag 810 /tmp/soak.ndjson.gz > soak.md
"""
import json
import os
import subprocess
import sys
import time


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def slope(xs, ys):
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def main():
    binary, seconds, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    flat_after = int(sys.argv[4]) if len(sys.argv) > 4 else 630
    if os.path.exists(path):
        os.remove(path)
    start = time.time()
    p = subprocess.Popen([binary, "record", "--interval", "50ms", "--duration", f"{seconds}s",
                          "--output", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rows = []
    while p.poll() is None:
        t = time.time() - start
        size = os.path.getsize(path) if os.path.exists(path) else 0
        rows.append((t, rss_kb(p.pid), size))
        time.sleep(10)
    out, err = p.communicate()
    wall = time.time() - start
    print(f"record: exit {p.returncode}, {wall:.0f} s wall; stderr: {err.decode().strip()[-300:]}")
    print()
    print("| t (s) | RSS (MB) | file (KB) |")
    print("|---|---|---|")
    for t, rss, size in rows:
        print(f"| {t:.0f} | {rss / 1024 if rss else float('nan'):.1f} | {size / 1024:.0f} |")
    fill = [r for r in rows if r[0] < flat_after and r[1]]
    flat = [r for r in rows if r[0] >= flat_after and r[1]]
    fill_slope = slope([r[0] for r in fill], [r[1] / 1024 for r in fill]) * 60
    rss_slope = slope([r[0] for r in flat], [r[1] / 1024 for r in flat]) * 60
    first = [r for r in rows if seconds * 0.25 <= r[0] < seconds * 0.5]
    last = [r for r in rows if r[0] >= seconds * 0.75]
    rate = lambda rs: slope([r[0] for r in rs], [r[2] / 1024 for r in rs]) * 60  # noqa: E731
    print()
    print(f"RSS slope while the history fills (t < {flat_after} s): {fill_slope:+.3f} MB/min; "
          f"after (t >= {flat_after} s, {len(flat)} samples): {rss_slope:+.3f} MB/min; "
          f"peak {max(r[1] for r in rows if r[1]) / 1024:.1f} MB")
    if first and last:
        print(f"file growth: {rate(first):.0f} KB/min in the second quarter, "
              f"{rate(last):.0f} KB/min in the last quarter")
    rep = subprocess.run([binary, "check", "--replay", path, "--json"], capture_output=True, text=True)
    try:
        report = json.loads(rep.stdout)
        ticks = report["window"]["ticks"]
        print(f"replay: exit {rep.returncode}, {ticks} ticks over {report['window']['covered_s']:.0f} s "
              f"({ticks / max(report['window']['covered_s'], 1):.1f}/s, expected 20/s), "
              f"warnings {report['source']['warnings']}")
    except (ValueError, KeyError) as e:
        print(f"replay failed: {e}; exit {rep.returncode}; {rep.stderr[-300:]}")


if __name__ == "__main__":
    main()
