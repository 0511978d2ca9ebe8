#!/usr/bin/env python3
"""Runs every workload in benches/workloads/ under `gpudiag run` on GPU 0 and prints, per
workload, the verdict gpudiag gave, whether it is the expected one, and gpudiag's profiling
counters beside NVML's GPM read through pynvml over the same time (the reference).

    python3 benches/verdicts.py GPUDIAG_BINARY OUTDIR [SECONDS]

Writes OUTDIR/NAME.json (the run report) and OUTDIR/NAME.ndjson.gz (the recording) per workload,
and OUTDIR/verdicts.json with the table. Needs PyTorch and nvidia-ml-py."""
import json
import os
import subprocess
import sys
import threading
import time

import pynvml as N

# workload -> accepted verdicts (the leak is judged by its finding; any verdict will do)
EXPECTED = {
    "bf16_matmul": {"compute_bound"},
    "fp32_matmul_no_tf32": {"compute_bound"},
    "elementwise": {"memory_bound"},
    "small_grid": {"underfilled"},
    "tiny_sync": {"launch_bound", "sync_bound"},
    "host_sleep": {"host_bound"},
    "pageable_copy": {"copy_bound"},
    "idle_holding": {"idle_holding_memory"},
    "leak": None,
}
METRICS = {
    "sm_active": N.NVML_GPM_METRIC_SM_UTIL,
    "occupancy": N.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor": N.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram": N.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "fp32": N.NVML_GPM_METRIC_FP32_UTIL,
}
EVIDENCE = {
    "sm_active": "sm_active_mean_pct",
    "occupancy": "sm_occupancy_mean_pct",
    "tensor": "tensor_active_mean_pct",
    "dram": "dram_active_mean_pct",
    "fp32": "fp32_active_mean_pct",
}


def gpm_metrics(handle, s1, s2):
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(METRICS)
    mg.sample1 = s1
    mg.sample2 = s2
    for i, mid in enumerate(METRICS.values()):
        mg.metrics[i].metricId = mid
    N.nvmlGpmMetricsGet(mg)
    return {k: mg.metrics[i].value for i, k in enumerate(METRICS)}


class Reference(threading.Thread):
    """GPM through pynvml once a second: the same counters, read by NVIDIA's own bindings."""

    def __init__(self, handle):
        super().__init__(daemon=True)
        self.handle = handle
        self.stop = threading.Event()
        self.readings = []

    def run(self):
        a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
        N.nvmlGpmSampleGet(self.handle, a)
        while not self.stop.wait(1.0):
            N.nvmlGpmSampleGet(self.handle, b)
            self.readings.append(gpm_metrics(self.handle, a, b))
            a, b = b, a


def gpm_cost(handle, n=200):
    """Milliseconds for one GPM sample plus one metrics read (what gpudiag adds per poll)."""
    a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(handle, a)
    time.sleep(0.11)
    t = time.perf_counter()
    for _ in range(n):
        N.nvmlGpmSampleGet(handle, b)
        gpm_metrics(handle, a, b)
    return (time.perf_counter() - t) / n * 1000


def main():
    binary, outdir = sys.argv[1], sys.argv[2]
    seconds = sys.argv[3] if len(sys.argv) > 3 else "20"
    os.makedirs(outdir, exist_ok=True)
    N.nvmlInit()
    handle = N.nvmlDeviceGetHandleByIndex(0)
    here = os.path.dirname(os.path.abspath(__file__))
    rows = []
    for name, expected in EXPECTED.items():
        ref = Reference(handle)
        ref.start()
        report_path = os.path.join(outdir, f"{name}.json")
        cmd = [binary, "run", "--force", "--interval", "500ms", "--report-file", report_path,
               "--record", os.path.join(outdir, f"{name}.ndjson.gz"), "--",
               sys.executable, os.path.join(here, "workloads", f"{name}.py"), seconds]
        done = subprocess.run(cmd, capture_output=True, text=True)
        ref.stop.set()
        ref.join()
        with open(os.path.join(outdir, f"{name}.stderr"), "w") as f:
            f.write(done.stderr)
        report = json.load(open(report_path))
        dev = next((d for d in report["devices"] if d["index"] == 0), {})
        verdict = (dev.get("verdict") or {})
        got = verdict.get("bottleneck")
        findings = sorted({f["id"] for f in report["findings"]})
        ok = ("memory.possible_leak" in findings) if expected is None else got in expected
        ev = verdict.get("evidence", {})
        reference = {k: round(sum(r[k] for r in ref.readings) / max(len(ref.readings), 1), 2)
                     for k in METRICS}
        ours = {k: ev.get(EVIDENCE[k]) for k in METRICS}
        rows.append({"workload": name, "verdict": got, "confidence": verdict.get("confidence"),
                     "right": ok, "findings": findings, "exit": done.returncode,
                     "util": ev.get("gpu_util_mean_pct"), "gpudiag": ours, "pynvml": reference,
                     "title": verdict.get("title")})
        print(f"{name:22} {str(got):20} {'right' if ok else 'WRONG':5} util {ev.get('gpu_util_mean_pct')}"
              f"  gpudiag {ours}  pynvml {reference}  findings {findings}", flush=True)
    cost = gpm_cost(handle)
    print(f"GPM sample + metrics read: {cost:.3f} ms per poll", flush=True)
    json.dump({"rows": rows, "gpm_cost_ms": cost}, open(os.path.join(outdir, "verdicts.json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
