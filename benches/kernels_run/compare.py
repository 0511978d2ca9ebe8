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


print("## cost: steps a second under `run` and `run --kernels`")
modes = sorted({os.path.basename(p).split("-plain-")[0]
                for p in glob.glob(os.path.join(d, "logs", "*-plain-1.out"))})
for mode in modes:
    rows = []
    for r in (1, 2):
        if mode.startswith("ddp-"):
            p, k = ddp_ms(f"{mode}-plain-{r}"), ddp_ms(f"{mode}-kernels-{r}")
            unit = "ms a step"
            ratio = (p / k) if p and k else None
        else:
            p, k = steps(f"{mode}-plain-{r}"), steps(f"{mode}-kernels-{r}")
            unit = "steps/s"
            ratio = (k / p) if p and k else None
        rows.append(f"round {r}: {p} → {k} {unit}, ×{ratio:.3f}" if ratio else f"round {r}: {p} → {k}")
    print(f"{mode:22} " + "; ".join(rows))

print()
print("## top kernels: torch.profiler against run --kernels")
for ref_path in sorted(glob.glob(os.path.join(d, "refs", "*.json"))):
    mode = os.path.basename(ref_path)[:-5]
    ref = load(ref_path) or {}
    ours = kernels_of(load(os.path.join(d, "reports", f"{mode}-kernels-1.json")))
    print(f"### {mode}")
    print("torch.profiler:", [k["name"][:60] for k in ref.get("kernels", [])[:5]])
    print("  copies:", [(c["name"], c["count"]) for c in ref.get("copies", [])[:3]])
    print("  syncs:", [(s["name"], s["count"]) for s in ref.get("syncs", [])[:3]])
    print("run --kernels:", json.dumps(ours)[:3000] if ours is not None else None)

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
