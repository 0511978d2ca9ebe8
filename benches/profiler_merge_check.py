#!/usr/bin/env python3
"""Checks a merged trace (gpudiag trace --merge / run --profiler-trace) against the pause that
benches/profiler_merge.py made and wrote to its side file:

1. clock alignment: the profiler's `gpudiag_pause` annotation, put on the wall clock as
   baseTimeNanoseconds / 1000 + ts, starts and ends within TOLERANCE µs (default 10) of the
   brackets of time.time_ns() readings taken on both sides of each of its edges (entering and
   leaving a record_function costs tens of µs of Python, which is not clock error);
2. gpudiag's tracks: on the GPU the loop ran on, the utilisation (`util %` gpu) and SM activity
   (`profiling %` sm_active, where the GPU has profiling counters) drop within one sampling
   interval of the pause's start, stay low inside it, and come back within one interval of its
   end. NVML's utilisation averages over the driver's own sample period and the profiling
   counters over two GPM samples: NVIDIA's own bindings see the GPU stop and start 120-330 ms
   late on an H200 (benches/nvml_lag.py), so at a 100 ms interval these edges fail by NVML's
   lag, not by the merge's clock (benches/RESULTS.md).

    python3 benches/profiler_merge_check.py MERGED.json[.gz] PAUSE.json --interval 100ms

Prints each measured edge and lag; exits 0 when every check passes, 1 otherwise. Needs only the
Python standard library."""
import argparse
import gzip
import json
import sys


def load(path):
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        return json.load(f)


def duration_ms(text):
    text = text.strip()
    for unit, scale in (("ms", 1.0), ("us", 1e-3), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("merged")
    ap.add_argument("pause")
    ap.add_argument("--interval", default="100ms", help="gpudiag's sampling interval")
    ap.add_argument("--tolerance-us", type=float, default=10.0)
    ap.add_argument("--low", type=float, default=5.0, help="a track is idle below this %%")
    args = ap.parse_args()

    trace = load(args.merged)
    side = json.load(open(args.pause))
    interval_us = duration_ms(args.interval) * 1000.0
    merge = trace.get("gpudiag")
    if merge is None:
        sys.exit("not a merged trace: no top-level 'gpudiag' key")
    base = trace.get("baseTimeNanoseconds")
    base_us = base / 1000.0 if base is not None else 0.0
    p0 = side["pause_start_ns"] / 1000.0
    p1 = side["pause_end_ns"] / 1000.0
    events = trace["traceEvents"]
    ok = True
    print(f"torch {side.get('torch')}, {side.get('gpu')}, pause {(p1 - p0) / 1e6:.3f} s, "
          f"interval {interval_us / 1000:.0f} ms, base {'first' if list(trace).index('baseTimeNanoseconds') < list(trace).index('traceEvents') else 'after traceEvents'}"
          if base is not None else "no baseTimeNanoseconds")

    # 1. The profiler's own annotation of the pause against time.time_ns().
    marks = [e for e in events if e.get("name") == "gpudiag_pause" and e.get("ph") == "X"]
    if not marks:
        print("FAIL alignment: no gpudiag_pause annotation in the trace")
        ok = False
    else:
        m = marks[0]
        start = base_us + float(m["ts"])
        end = start + float(m["dur"])
        # The annotation's true edges lie in [enter, pause start] and [pause end, exit] (Python
        # and profiler overhead on either side); the clock is off by how far outside they fall.
        lo0 = side.get("annotation_enter_ns", side["pause_start_ns"]) / 1000.0
        hi1 = side.get("annotation_exit_ns", side["pause_end_ns"]) / 1000.0
        off0 = max(lo0 - start, start - p0, 0.0)
        off1 = max(p1 - end, end - hi1, 0.0)
        good = off0 <= args.tolerance_us and off1 <= args.tolerance_us
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} alignment: annotation start {start - p0:+.1f} us from the "
              f"pause start (bracket {lo0 - p0:+.1f}..0, outside by {off0:.1f}), end {end - p1:+.1f} us "
              f"from the pause end (bracket 0..{hi1 - p1:+.1f}, outside by {off1:.1f}); tolerance "
              f"{args.tolerance_us} us")

    # 2. gpudiag's GPU tracks around the pause.
    device = side.get("device", 0)
    names = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    pids = [p for p, n in names.items() if isinstance(p, int) and p >= merge["pid_base"]
            and n.startswith(f"gpudiag: GPU {device} ")]
    if not pids:
        sys.exit(f"no gpudiag process for GPU {device}; processes: {sorted(set(names.values()))}")
    pid = pids[0]
    for counter, series in (("util %", "gpu"), ("profiling %", "sm_active")):
        points = sorted((base_us + float(e["ts"]), float(e["args"][series])) for e in events
                        if e.get("pid") == pid and e.get("ph") == "C" and e.get("name") == counter
                        and series in e.get("args", {}))
        if not points:
            print(f"skip {counter} {series}: no such track (no profiling counters on this GPU?)")
            continue
        busy = [v for t, v in points if t < p0 - interval_us]
        busy_level = sorted(busy)[len(busy) // 2] if busy else None
        drop = next((t for t, v in points if t >= p0 - interval_us and v < args.low), None)
        inside = [v for t, v in points if p0 + interval_us < t < p1 - interval_us]
        high = max(args.low, 0.5 * busy_level) if busy_level else args.low
        rise = next((t for t, v in points if t >= p1 - interval_us and v >= high), None)
        checks = [
            ("busy before the pause", busy_level is not None and busy_level >= 2 * args.low,
             f"median {busy_level}"),
            ("drop at the pause start", drop is not None and abs(drop - p0) <= interval_us,
             "never" if drop is None else f"{(drop - p0) / 1000:+.1f} ms"),
            ("idle inside the pause", all(v < args.low for v in inside),
             f"max {max(inside) if inside else 'n/a'} over {len(inside)} changes"),
            ("back at the pause end", rise is not None and abs(rise - p1) <= interval_us,
             "never" if rise is None else f"{(rise - p1) / 1000:+.1f} ms"),
        ]
        for what, good, detail in checks:
            ok &= bool(good)
            print(f"{'ok  ' if good else 'FAIL'} {counter} {series}: {what} ({detail})")
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
