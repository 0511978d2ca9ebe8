#!/usr/bin/env python3
"""The job verdict's table and the confusion matrix of every verdict, from recordings.

    python3 benches/job_verdicts.py GPUDIAG_BINARY [JOBS_DIR] [WORKLOADS_DIR]

Replays each multi-GPU job recording (default tests/fixtures/jobs, made on a GPU host by
benches/job_verdicts.sh) and each single-GPU workload recording (default
tests/fixtures/workloads, made by benches/verdicts.py) through `check --json`, then prints in
markdown:

1. per job: expected and got verdict and straggler, the peers' estimated wait, and each GPU's
   window figures;
2. the margins: each deciding figure beside its threshold ([rules.job] defaults);
3. the confusion matrix of the job verdicts and of the single-GPU verdicts (rows expected,
   columns got).

A recording's name says what it was made to be: N gpu-MODE (benches/workloads/job.py's modes)
and the single-GPU workload names of benches/verdicts.py.
"""
import glob
import json
import os
import subprocess
import sys

JOB_EXPECTED = {
    "balanced": ("balanced", None),
    "slow13": ("straggler", "slow"),
    "slow2": ("straggler", "slow"),
    "cpu_starved": ("straggler", "slow"),
    "shared": ("straggler", "slow"),
    "comm": ("communication_bound", None),
    "pipeline": ("imbalanced", None),
}
SINGLE_EXPECTED = {
    "bf16_matmul": "compute_bound",
    "fp32_matmul_no_tf32": "compute_bound",
    "elementwise": "memory_bound",
    "small_grid": "underfilled",
    "tiny_sync": "sync_bound",
    "host_sleep": "host_bound",
    "pageable_copy": "copy_bound",
    "idle_holding": "idle_holding_memory",
    # Its compute is one 2048² matmul every 100 ms: the leak is a finding, the verdict idle.
    "leak": "idle_holding_memory",
}
JOB_ORDER = ["balanced", "straggler", "communication_bound", "imbalanced", "none"]
SINGLE_ORDER = ["compute_bound", "memory_bound", "underfilled", "launch_bound", "sync_bound",
                "host_bound", "copy_bound", "idle_holding_memory", "throttled", "idle",
                "waiting_for_peer", "none"]
THRESHOLDS = {"lead_ratio": 1.15, "lag_util_points": 20.0, "peers_busy_util_pct": 50.0,
              "memory_spread_ratio": 1.25, "communication_min_gb_per_s": 50.0,
              "communication_max_tensor_pct": 10.0}


def check(binary, path):
    out = subprocess.run([binary, "--config", "/dev/null", "check", "--json", "--replay", path],
                         capture_output=True, text=True, check=False)
    return json.loads(out.stdout)


def fmt(v, nd=0, unit=""):
    return "n/a" if v is None else f"{v:.{nd}f}{unit}"


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def matrix(title, order, pairs):
    seen = [o for o in order if any(o in p for p in pairs)]
    print(f"\n{title} (rows expected, columns got):\n")
    print("| expected \\ got | " + " | ".join(seen) + " |")
    print("|---|" + "---|" * len(seen))
    for e in seen:
        if not any(p[0] == e for p in pairs):
            continue
        row = [str(sum(1 for p in pairs if p == (e, g))) for g in seen]
        print(f"| {e} | " + " | ".join(row) + " |")
    right = sum(1 for e, g in pairs if e == g)
    print(f"\n{right} of {len(pairs)} right.")


def main():
    binary = sys.argv[1]
    jobs_dir = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/jobs"
    single_dir = sys.argv[3] if len(sys.argv) > 3 else "tests/fixtures/workloads"
    job_pairs = []
    margins = []
    print("| recording | expected | got | straggler expected / got | peers wait | "
          "per GPU: util / SM active / tensor % · power W · NVLink GB/s · held GiB · CPU % |")
    print("|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(jobs_dir, "*.ndjson*"))):
        name = os.path.basename(path).split(".")[0]
        gpus, mode = name.split("gpu-")
        expected, slow = JOB_EXPECTED[mode]
        slow_device = (int(gpus) // 2) if slow else None
        r = check(binary, path)
        jobs = r.get("jobs") or []
        j = jobs[0] if jobs else None
        got = j["verdict"] if j else "none"
        job_pairs.append((expected, got))
        s = (j or {}).get("straggler") or {}
        peers = (j or {}).get("peers", [])
        cells = []
        for p in peers:
            mark = " ◀" if s.get("device") == p["device"] else ""
            cells.append(
                f"{p['device']}: {fmt(p['gpu_util_pct'])}/{fmt(p['sm_active_pct'])}/"
                f"{fmt(p['tensor_active_pct'])} · {fmt(p['power_w'])} · "
                f"{fmt((p['nvlink_bytes_per_s'] or 0) / 1e9)} · "
                f"{fmt((p['job_memory_bytes'] or 0) / 2**30, 1)} · "
                f"{fmt(p['process_cpu_pct'])}{mark}")
        wait = s.get("peers_wait_share")
        print(f"| {name} | {expected} | {got} | {fmt(slow_device) if slow else '—'} / "
              f"{s.get('device', '—')} | {'—' if wait is None else fmt(wait * 100) + '%'} | "
              + "<br>".join(cells) + " |")
        if peers:
            sm = [p["sm_active_pct"] for p in peers]
            util = [p["gpu_util_pct"] for p in peers]
            lead = max((x / median([y for k, y in enumerate(sm) if k != i])
                        for i, x in enumerate(sm)), default=None)
            lag = max((median([y for k, y in enumerate(util) if k != i]) - x
                       for i, x in enumerate(util)), default=None)
            mem = [p["job_memory_bytes"] for p in peers]
            links = [((p["nvlink_bytes_per_s"] or 0) + (p["pcie_bytes_per_s"] or 0)) / 1e9
                     for p in peers]
            tensor = [p["tensor_active_pct"] for p in peers]
            margins.append((name, got, lead, lag, max(mem) / min(mem), min(links),
                            max(tensor)))
    print("\nMargins: each recording's deciding figures beside the thresholds "
          f"(lead ≥ {THRESHOLDS['lead_ratio']}×, lag ≥ {THRESHOLDS['lag_util_points']:.0f} "
          f"points, memory spread ≥ {THRESHOLDS['memory_spread_ratio']}×, communication: "
          f"every GPU ≥ {THRESHOLDS['communication_min_gb_per_s']:.0f} GB/s with tensor < "
          f"{THRESHOLDS['communication_max_tensor_pct']:.0f}%):\n")
    print("| recording | got | largest SM-active lead (×) | largest utilisation lag (points) | "
          "memory spread (×) | least link GB/s | most tensor % |")
    print("|---|---|---|---|---|---|---|")
    for name, got, lead, lag, mem, link, tensor in margins:
        print(f"| {name} | {got} | {fmt(lead, 2)} | {fmt(lag, 1)} | {fmt(mem, 2)} | "
              f"{fmt(link)} | {fmt(tensor, 1)} |")
    matrix("Job verdicts", JOB_ORDER, job_pairs)
    single_pairs = []
    for path in sorted(glob.glob(os.path.join(single_dir, "*.ndjson*"))):
        name = os.path.basename(path).split(".")[0]
        if name not in SINGLE_EXPECTED:
            continue
        r = check(binary, path)
        v = r["devices"][0].get("verdict") if r.get("devices") else None
        single_pairs.append((SINGLE_EXPECTED[name], v["bottleneck"] if v else "none"))
        if r.get("jobs"):
            print(f"\nunexpected job verdict on single-GPU {name}: {r['jobs'][0]['title']}")
    matrix("Single-GPU verdicts", SINGLE_ORDER, single_pairs)


if __name__ == "__main__":
    main()
