"""What `--kernels=sample` costs, read inside one process: its steps inside the windows and at
their edges against its steps well away from them (benches/kernels_run/workloads.py's
KRUN_STEP_LOG). Two runs of the same loop on one host differ by more than the 1% this is about,
so the reference is the same process with CUPTI detached.

    sampling_cost.py [--settle S] [--near S] LOG:ON/PERIOD ...

LOG is a step log; ON/PERIOD the run's schedule in seconds (`1/20` for the default
`--kernels=sample`). A plain run (no gpudiag) given a schedule is the control: what the same
arithmetic reads where nothing was recorded.

Windows follow the Unix clock: [k*PERIOD, k*PERIOD + ON). Each step (from the previous step's
return to its own) is
  inside   within a window;
  edge     holding a window's opening or closing (attaching at the first CUDA call after the
           opening), or beginning within `settle` after a closing (detaching, which waits for the
           GPU to run what was queued, at the first call after it);
  outside  the rest: the reference.
The cost is the share of the run's time beyond every step at the pace of the outside steps
around it (their median within `--near` seconds, 5 by default: a host whose pace drifts over tens
of seconds, as a Python-bound loop's does, would otherwise read its drift as cost), split into the
part inside the windows and the part at their edges. A median sits below the mean of a skewed
pace, so this reads a little high: the plain runs say by how much. `inside_slowdown` is how much slower the loop ran inside (what recording in
full costs it); `lost_s_per_window` the time lost per window of recording, edges and all, so
another schedule with the same ON costs about lost_s_per_window / PERIOD (`predicted`).
"""

import bisect
import json
import statistics
import sys


def classify(ends_ns, start_ns, on_s, period_s, settle_s):
    """(kind, end_ns, dt_ns) for each step."""
    on, period, settle = int(on_s * 1e9), int(period_s * 1e9), int(settle_s * 1e9)
    steps = []
    prev = start_ns
    for end in ends_ns:
        # The windows (and their closings) that touch [prev - settle, end].
        kind = "outside"
        for k in range((prev - settle - on) // period, end // period + 1):
            opened, closed = k * period, k * period + on
            if prev <= opened <= end or prev <= closed <= end:
                kind = "edge"
            elif closed < prev < closed + settle:
                kind = "edge"
            elif opened < prev and end < closed and kind == "outside":
                kind = "inside"
        steps.append((kind, end, end - prev))
        prev = end
    return steps


def local_reference(steps, near_s):
    """For each step, the median of the outside steps ending within near_s of it (a median: a
    burst of slow steps near a window, which a busy host gives now and then, would move a mean)."""
    outside = [(end, dt) for kind, end, dt in steps if kind == "outside"]
    ends = [e for e, _ in outside]
    near = int(near_s * 1e9)
    refs = []
    for _, end, _ in steps:
        a, b = bisect.bisect_left(ends, end - near), bisect.bisect_right(ends, end + near)
        refs.append(statistics.median(dt for _, dt in outside[a:b]) if b - a >= 3 else None)
    return refs


def in_windows(start_ns, end_ns, on_s, period_s):
    on, period = int(on_s * 1e9), int(period_s * 1e9)
    total = 0
    for k in range(start_ns // period, end_ns // period + 1):
        a, b = max(start_ns, k * period), min(end_ns, k * period + on)
        total += max(0, b - a)
    return total


def analyse(path, on_s, period_s, settle_s, near_s):
    with open(path) as f:
        log = json.load(f)
    ends, start = log["steps_end_ns"], log["start_ns"]
    if len(ends) < 10:
        return {"log": path, "error": f"{len(ends)} steps: too few"}
    steps = classify(ends, start, on_s, period_s, settle_s)
    total = ends[-1] - start
    parts = {k: [dt for kind, _, dt in steps if kind == k] for k in ("inside", "edge", "outside")}
    if len(parts["outside"]) < 5:
        return {"log": path, "error": "too few steps away from the windows"}
    refs = local_reference(steps, near_s)
    if any(r is None for r in refs):
        return {"log": path, "error": f"a step with no outside steps within {near_s:g} s"}
    excess = {k: 0.0 for k in parts}
    inside_ratio = []
    for (kind, _, dt), ref in zip(steps, refs):
        excess[kind] += dt - ref
        if kind == "inside":
            inside_ratio.append(dt / ref)
    inside_slowdown = statistics.fmean(inside_ratio) - 1 if inside_ratio else None
    ref = statistics.fmean(parts["outside"])
    recorded = in_windows(start, ends[-1], on_s, period_s)
    # Windows cut by the run's ends count as the part of one they hold.
    whole_windows = recorded / 1e9 / on_s
    row = {
        "log": path,
        "mode": log.get("mode"),
        "schedule": f"{on_s:g}s/{period_s:g}s",
        "seconds": round(total / 1e9, 2),
        "steps": len(ends),
        "windows": round(whole_windows, 2),
        "duty": round(recorded / total, 4),
        "step_ms_outside": round(ref / 1e6, 3),
        "steps_inside_edge_outside": [len(parts[k]) for k in ("inside", "edge", "outside")],
        "inside_slowdown": None if inside_slowdown is None else round(inside_slowdown, 4),
        "cost": round((excess["inside"] + excess["edge"]) / total, 4),
        "cost_inside": round(excess["inside"] / total, 4),
        "cost_edges": round(excess["edge"] / total, 4),
    }
    if whole_windows > 0:
        lost = (excess["inside"] + excess["edge"]) / 1e9 / whole_windows
        row["lost_s_per_window"] = round(lost, 4)
        row["predicted"] = {
            f"{on_s:g}s/{p}s": round(lost / p, 4) for p in (10, 20, 30, 60) if p > on_s
        }
    return row


def main():
    args = sys.argv[1:]
    settle, near = 0.5, 5.0
    while args[:1] in (["--settle"], ["--near"]):
        if args[0] == "--settle":
            settle = float(args[1])
        else:
            near = float(args[1])
        args = args[2:]
    if not args:
        sys.exit(__doc__)
    for arg in args:
        path, _, schedule = arg.rpartition(":")
        on, _, period = schedule.partition("/")
        try:
            row = analyse(path, float(on), float(period), settle, near)
        except (OSError, ValueError, KeyError) as e:
            row = {"log": path, "error": str(e)}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
