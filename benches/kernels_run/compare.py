"""Tables from a benches/kernels_run.sh directory: cost of --kernels, and what it names against
torch.profiler.

    compare.py DIR
"""

import glob
import json
import os
import re
import sys

d = sys.argv[1]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def steps(name):
    try:
        with open(os.path.join(d, "logs", name + ".out")) as f:
            lines = [line for line in f if line.startswith("{")]
        return json.loads(lines[-1])["steps_per_s"] if lines else None
    except (OSError, ValueError, KeyError):
        return None


def ddp_ms(name):
    try:
        with open(os.path.join(d, "logs", name + ".out")) as f:
            m = re.search(r"([0-9.]+) ms a step", f.read())
        return float(m.group(1)) if m else None
    except OSError:
        return None


def kernels_of(report):
    """The report's kernels section, wherever the run report keeps it."""
    if not isinstance(report, dict):
        return None
    return report.get("kernels")


print("## cost: steps a second under `run`, `run --kernels` and `run --kernels=sample`")
modes = sorted({os.path.basename(p).split("-plain-")[0]
                for p in glob.glob(os.path.join(d, "logs", "*-plain-1.out"))})
rounds = sorted({int(p.rsplit("-", 1)[1].split(".")[0])
                 for p in glob.glob(os.path.join(d, "logs", "*-plain-*.out"))})
for mode in modes:
    rows = []
    for r in rounds:
        ddp = mode.startswith("ddp-")
        figure = ddp_ms if ddp else steps
        p = figure(f"{mode}-plain-{r}")
        cells = [f"plain {p}"]
        sampled = sorted({os.path.basename(q)[len(mode) + 1:].rsplit("-", 1)[0]
                          for q in glob.glob(os.path.join(d, "logs", f"{mode}-sample_*-{r}.out"))})
        for how in ("kernels", "sample", *sampled):
            k = figure(f"{mode}-{how}-{r}")
            if k is None:
                continue
            ratio = (p / k if ddp else k / p) if p else None
            cells.append(f"{how} {k} (×{ratio:.3f})" if ratio else f"{how} {k}")
        rows.append(f"round {r}: " + ", ".join(cells))
    print(f"{mode:22} {'ms a step' if mode.startswith('ddp-') else 'steps/s'}; " + "; ".join(rows))


rows = []
try:
    with open(os.path.join(d, "sampling.txt")) as f:
        rows = [json.loads(line) for line in f if line.startswith("{")]
except (OSError, ValueError):
    pass
if rows:
    print()
    print("## --kernels=sample read inside each run (sampling_cost.py; plain runs: the control)")
    print(f"{'run':40} {'schedule':>8} {'s':>6} {'windows':>7} {'duty':>6} {'inside':>7} "
          f"{'cost':>7} {'edges':>7} {'lost/window s':>13}")
    for row in rows:
        name = os.path.basename(row["log"])[:-5]
        if "error" in row:
            print(f"{name:40} {row['error']}")
            continue
        slow = row.get("inside_slowdown")
        print(f"{name:40} {row['schedule']:>8} {row['seconds']:6.1f} {row['windows']:7.2f} "
              f"{row['duty']:6.3f} {'' if slow is None else f'{slow:+.3f}':>7} "
              f"{row['cost']:+7.4f} {row['cost_edges']:+7.4f} {row.get('lost_s_per_window', 0):13.4f}")

print()
print("## top kernels: torch.profiler against run --kernels (first round)")


def short(name, n=70):
    return name if len(name) <= n else name[: n - 1] + "…"


for ref_path in sorted(glob.glob(os.path.join(d, "refs", "*.json"))):
    mode = os.path.basename(ref_path)[:-5]
    ref = load(ref_path) or {}
    report = load(os.path.join(d, "reports", f"{mode}-kernels-1.json")) or {}
    ours = kernels_of(report) or {}
    print(f"### {mode}")
    ref_kernels = [k["name"] for k in ref.get("kernels", [])[:5]]
    our_kernels = [k["name"] for g in ours.get("gpus", [])[:1] for k in g.get("top_kernels", [])[:5]]
    print("torch.profiler top 5 kernels (3 s):")
    for k in ref.get("kernels", [])[:5]:
        print(f"  {k['count']:>8} × {k['total_us'] / max(k['count'], 1):9.1f} µs  {short(k['name'])}")
    print("run --kernels top 5 kernels:")
    for g in ours.get("gpus", [])[:1]:
        for k in g.get("top_kernels", [])[:5]:
            print(f"  {k['count']:>8} × {k['mean_us']:9.1f} µs  {k['share_of_busy'] * 100:5.1f}%  "
                  f"{short(k['name'])}")
        t = g.get("time", {})
        print(f"  time: span {t.get('span_s')} s, compute {t.get('compute_s')}, nccl {t.get('nccl_s')}, "
              f"copies {t.get('copy_s')}, idle {t.get('idle_s')}; {g.get('kernels_per_s')} kernels/s, "
              f"mean {g.get('mean_kernel_us')} µs")
        for c in g.get("copies", [])[:3]:
            print(f"  copies {c['direction']} {c['host_memory']}: {c['count']} × {c['bytes'] // max(c['count'], 1)} B, "
                  f"{c.get('gb_per_s')} GB/s")
    same = len(set(ref_kernels[:3]) & set(our_kernels[:5]))
    print(f"of torch.profiler's top 3, in run --kernels' top 5: {same}")
    print("torch.profiler copies:", [(c["name"], c["count"]) for c in ref.get("copies", [])[:3]])
    print("torch.profiler syncs:", [(s_["name"], s_["count"]) for s_ in ref.get("syncs", [])[:3]])
    for p in ours.get("processes", []):
        print(f"run --kernels pid {p['pid']}: {p['kernels']} kernels, losses {p.get('losses')}, "
              f"cupti {p.get('cupti_source')} {p.get('cupti_api_version')}, "
              f"stepped aside {len(p.get('stepped_aside', []))}")
        for s_ in p.get("syncs", [])[:3]:
            print(f"  sync {s_['call_name']}: {s_['count']}, {s_.get('per_s')}/s, "
                  f"{s_.get('share_of_host')} of host time")
    if ours.get("not_recorded"):
        print("not recorded:", ours["not_recorded"])
    if ours.get("left_out"):
        print("left out:", ours["left_out"])
    for dev in report.get("devices", []):
        v = dev.get("verdict") or {}
        print(f"verdict GPU {dev.get('index')}: {v.get('bottleneck')} ({v.get('basis')}, "
              f"{v.get('confidence')}): {v.get('title')}")

print()
print("## each rank's NCCL time (ddp)")
for path in sorted(glob.glob(os.path.join(d, "reports", "ddp-*.json"))):
    if "-plain-" in os.path.basename(path):
        continue
    report = load(path) or {}
    ours = kernels_of(report) or {}
    shares = [(p["pid"], p.get("nccl_share"), p.get("nccl_s")) for p in ours.get("processes", [])]
    print(os.path.basename(path), "shares:", shares, "laggard:", ours.get("nccl_laggard"))
    arrivals = ours.get("nccl_arrivals") or {}
    print("  arrivals: matched", arrivals.get("matched"), "unmatched", arrivals.get("unmatched"),
          "waited_for", arrivals.get("waited_for"),
          [(a["pid"], round(a["last_share"], 3), round(a["peers_waited_s"], 3))
           for a in arrivals.get("by_pid", [])])
    for job in report.get("jobs", []):
        print("  job:", job.get("verdict", job.get("kind")), str(job.get("title", ""))[:200])

print()
print("## the user's torch.profiler inside run --kernels")
with open(os.path.join(d, "runs.txt")) as f:
    for line in f:
        if line.startswith("profiler"):
            print(line.rstrip()[:600])

print()
print("## runs")
with open(os.path.join(d, "runs.txt")) as f:
    for line in f:
        print(line.rstrip()[:300])
