#!/usr/bin/env python3
"""Wall time and peak resident memory of one command (os.wait4 of the child: its own peak,
its waited-for children included), for `probe --suite standard` and the like:

    python3 benches/peak_rss.py [--runs N] -- .gpu-bundle/gpudiag probe --suite standard --json

The command's stdout goes to /dev/null (its stderr is kept). Prints one Markdown row per run.
Linux counts the forking Python's own resident set into the child's peak at exec, so a peak
below this script's RSS (about 10-14 MB) is Python's, not the command's.
"""
import argparse
import os
import subprocess
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given")
    print("| command | wall (s) | peak RSS (MB) | exit |")
    print("|---|---|---|---|")
    for _ in range(args.runs):
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        print(f"| `{' '.join(cmd)}` | {wall:.1f} | {usage.ru_maxrss / 1024:.0f} | "
              f"{os.waitstatus_to_exitcode(status)} |")


if __name__ == "__main__":
    main()
