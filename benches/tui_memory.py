#!/usr/bin/env python3
"""Where the terminal UI's idle memory goes, side by side with `nvidia-smi dmon` in one run.

Each tool runs in turn (not at once: pages of libnvidia-ml that two processes map would count
half in each one's PSS) for --seconds in a 120x36 pty (dmon on a pipe), at a 1 s refresh, idle
GPU. Shortly before it is stopped its /proc entries are read: VmRSS, VmHWM, RssAnon, RssFile and
Threads from status; Pss, Pss_Anon, Pss_File from smaps_rollup; and /proc/PID/smaps summed by
what each mapping is (the tool's own executable, libnvidia-ml, libc and other libraries, the
heap, thread stacks, other anonymous memory, /dev/nvidia* device mappings). Prints Markdown
tables and writes the raw numbers to $OUT/tui_memory.json. From the repository root:

    python3 benches/tui_memory.py --gpudiag .gpu-bundle/gpudiag [--seconds 30]   # GPU host
    python3 benches/tui_memory.py --gpudiag target/release/gpudiag --demo --seconds 10

Variants of gpudiag run too, to show a change's share in the same run: `before` turns the idle
memory release off (`GPUDIAG_IDLE_TRIM=off`). nvitop is not run.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tui_idle import dmon_data_line, drain, spawn_in_pty  # noqa: E402


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0])
            elif key == "Threads":
                out[key] = int(value)
    return out


def rollup(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Anonymous",
                           "Private_Dirty", "Shared_Clean"):
                    out[key] = int(value.split()[0])
    except OSError as e:
        out["error"] = str(e)
    return out


def category(path, size_kb, exe):
    if not path:
        # Rust's threads get 2 MiB stacks (plus a guard page), glibc's default is 8 MiB.
        if size_kb in (2048, 2052, 8192, 8196):
            return "thread stacks (anon, stack-sized)"
        return "other anonymous"
    if path == "[heap]":
        return "heap"
    if path == "[stack]":
        return "main stack"
    if path.startswith("["):
        return "kernel ([vdso], [vvar] ...)"
    if exe and os.path.realpath(path) == exe:
        return "the executable"
    base = os.path.basename(path)
    if "libnvidia-ml" in base:
        return "libnvidia-ml"
    if base.startswith("libc.so") or base.startswith("libc-"):
        return "libc"
    if path.startswith("/dev/nvidia"):
        return "/dev/nvidia* mappings"
    if ".so" in base:
        return "other libraries"
    return "other files"


def smaps_breakdown(pid):
    """kB of Rss, Pss and Anonymous per kind of mapping; the count of mappings."""
    try:
        exe = os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        exe = None
    cats = {}
    cur = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    path = " ".join(parts[5:]) if len(parts) > 5 else ""
                    path = path.replace(" (deleted)", "")
                    cur = cats.setdefault(category(path, (hi - lo) // 1024, exe),
                                          {"Rss": 0, "Pss": 0, "Anonymous": 0, "mappings": 0,
                                           "Size": 0})
                    cur["mappings"] += 1
                    cur["Size"] += (hi - lo) // 1024
                elif cur is not None and parts[0].rstrip(":") in ("Rss", "Pss", "Anonymous"):
                    cur[parts[0].rstrip(":")] += int(parts[1])
    except OSError as e:
        return {"error": str(e)}
    return cats


def measure(name, cmd, seconds, use_pty, shown, extra_env=None):
    started = time.perf_counter()
    first, head = [None], [b""]
    env = dict(os.environ, **(extra_env or {}))
    if use_pty:
        proc, fd = spawn_in_pty(cmd, extra_env)
    else:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        fd = proc.stdout.fileno()
    reader = threading.Thread(target=drain, args=(fd, shown, started, first, head), daemon=True)
    reader.start()
    # The reading at 85% of the run and at its end: a steady state shows as two equal ones.
    time.sleep(seconds * 0.85)
    mid = status(proc.pid)
    time.sleep(seconds * 0.15)
    st, ro, br = status(proc.pid), rollup(proc.pid), smaps_breakdown(proc.pid)
    tids = os.listdir(f"/proc/{proc.pid}/task")
    names = []
    for t in tids:
        try:
            with open(f"/proc/{proc.pid}/task/{t}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    if use_pty:
        os.write(fd, b"q")
    else:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(timeout=2)
    if use_pty:
        os.close(fd)
    return {"tool": name, "status": st, "status_at_85pct": mid, "rollup": ro, "smaps": br,
            "threads": sorted(names), "live": b"LIVE" in head[0], "exit": proc.returncode,
            "first_output_ms": None if first[0] is None else first[0] * 1000}


def mb(kb):
    return "n/a" if kb is None else f"{kb / 1024:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpudiag", default=os.environ.get("GPUDIAG_BIN", ".gpu-bundle/gpudiag"))
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--demo", action="store_true", help="gpudiag --demo only (no GPU)")
    ap.add_argument("--no-before", action="store_true", help="skip the GPUDIAG_IDLE_TRIM=off row")
    args = ap.parse_args()
    base = [args.gpudiag, "--interval", "1s"] + (["--demo"] if args.demo else [])
    jobs = [("gpudiag", base, True, lambda out: b"Devices" in out, None)]
    if not args.no_before:
        jobs.append(("gpudiag, before (GPUDIAG_IDLE_TRIM=off)", base, True,
                     lambda out: b"Devices" in out, {"GPUDIAG_IDLE_TRIM": "off"}))
    if not args.demo and shutil.which("nvidia-smi"):
        jobs.append(("nvidia-smi dmon -d 1", ["nvidia-smi", "dmon", "-d", "1"], False,
                     dmon_data_line, None))
    rows = []
    for name, cmd, use_pty, shown, env in jobs:
        r = measure(name, cmd, args.seconds, use_pty, shown, env)
        if name.startswith("gpudiag") and not args.demo and not r["live"]:
            r["note"] = "NOT LIVE: no GPU seen"
        rows.append(r)
        print(f"{name}: done", file=sys.stderr, flush=True)

    print(f"\nIdle, {args.seconds:.0f} s each, in turn, at a 1 s refresh; MB = 2^20 bytes, read "
          "at the end of each run (RSS at 85% of the run in brackets).\n")
    print("| tool | RSS | PSS | anonymous (RssAnon) | file-backed (RssFile) | peak RSS (VmHWM) "
          "| threads | exit | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, ro = r["status"], r["rollup"]
        print(f"| `{r['tool']}` | {mb(s.get('VmRSS'))} ({mb(r['status_at_85pct'].get('VmRSS'))}) "
              f"| {mb(ro.get('Pss'))} | {mb(s.get('RssAnon'))} | {mb(s.get('RssFile'))} "
              f"| {mb(s.get('VmHWM'))} | {s.get('Threads')} | {r['exit']} | {r.get('note', '')} |")
    cats = sorted({c for r in rows for c in r["smaps"] if c != "error"})
    print("\nRSS / PSS by kind of mapping (MB; mappings in brackets):\n")
    print("| kind | " + " | ".join(f"`{r['tool']}`" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for c in cats:
        cells = []
        for r in rows:
            v = r["smaps"].get(c)
            cells.append("–" if not v else f"{mb(v['Rss'])} / {mb(v['Pss'])} ({v['mappings']})")
        print(f"| {c} | " + " | ".join(cells) + " |")
    for r in rows:
        print(f"\n`{r['tool']}` threads: {', '.join(r['threads'])}")
    dest = os.environ.get("OUT", ".")
    with open(os.path.join(dest, "tui_memory.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
