#!/usr/bin/env python3
"""gpudiag's own memory under `run --kernels` while a flood of kernel records arrives (issue 37:
"bounded over a 10-minute run of 10^7 kernels"), on any machine: no GPU needed.

    python3 benches/kernels_memory.py --gpudiag target/release/gpudiag [--kernels N]
        [--seconds S] [--case NAME ...]

The command gpudiag runs is the collector's own test driver (crates/kernels/tests/c/driver.c)
loading the real collector, as `run --kernels` hands it over, against a stand-in libcupti
(tests/c/fake_cupti.c) that fills CUPTI buffers with kernels as fast as the collector takes
them, or spread over S seconds. Each case reads gpudiag's resident memory every 100 ms from
/proc (VmRSS, and VmHWM at the last read) and its run report (kernels counted, records lost:
`cupti_dropped` is the stand-in's own count, 2 a buffer; `gpudiag_behind` the batches gpudiag
dropped because its consumer was behind, as the report says).
Cases:
  idle       the driver loads the collector and records nothing (the floor)
  few        N kernels of 16 names
  many       N kernels of 100,000 names (past the 2,048-a-GPU table)
  nccl       N kernels of 16 names, every tenth an NCCL all-reduce (the arrivals timeline)
  trace      `few` with --trace (at most 250,000 records kept for it)
  record     `few` with --record (the summary written every 10 s)
  paced      `many` spread over --seconds (default 600: ten minutes), every tenth NCCL
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
C = os.path.join(ROOT, "crates", "kernels", "tests", "c")
INCLUDE = os.path.join(ROOT, "crates", "kernels", "collector")


def build(tmp):
    fake = os.path.join(tmp, "libfakecupti.so")
    driver = os.path.join(tmp, "driver")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{INCLUDE}", "-o", fake,
                    os.path.join(C, "fake_cupti.c")], check=True)
    subprocess.run([cc, "-O2", f"-I{INCLUDE}", "-o", driver, os.path.join(C, "driver.c"),
                    "-ldl"], check=True)
    return fake, driver


def status_kib(pid):
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0])
    except (OSError, ValueError):
        pass
    return values


def run_case(args, name, fake, driver, tmp):
    kernels, names, seconds, extra, nccl = args.kernels, 16, 0, [], False
    if name == "idle":
        kernels = 0
    elif name == "many":
        names = 100_000
    elif name == "nccl":
        nccl = True
    elif name == "trace":
        extra = ["--trace", os.path.join(tmp, "trace.json")]
    elif name == "record":
        extra = ["--record", os.path.join(tmp, "run.ndjson"), "--force"]
    elif name == "paced":
        names, seconds, nccl = 100_000, args.seconds, True
    report = os.path.join(tmp, f"{name}.json")
    command = ["sh", "-c", 'exec "$0" "$CUDA_INJECTION64_PATH" "$@"', driver]
    command += ["init"] if kernels == 0 else ["flood", str(kernels), str(names), str(seconds)]
    if nccl:
        command.append("nccl")
    env = dict(os.environ, GPUDIAG_CUPTI=fake)
    start = time.monotonic()
    proc = subprocess.Popen([args.gpudiag, "run", "--kernels", "--report-file", report, *extra,
                             "--", *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak_rss, hwm = 0, 0
    while proc.poll() is None:
        values = status_kib(proc.pid)
        peak_rss = max(peak_rss, values.get("VmRSS", 0))
        hwm = max(hwm, values.get("VmHWM", 0))
        time.sleep(0.1)
    out, err = proc.communicate()
    wall = time.monotonic() - start
    counted, lost = None, None
    try:
        with open(report) as f:
            k = json.load(f).get("kernels") or {}
        counted = sum(g.get("kernels", 0) for g in k.get("gpus", []))
        lost = {key: sum(p.get("losses", {}).get(key, 0) for p in k.get("processes", []))
                for key in ("cupti_dropped", "send_dropped")}
        behind = [line for line in k.get("left_out", []) if "could not take in time" in line]
        lost["gpudiag_behind"] = behind[0].split()[0] if behind else 0
    except (OSError, ValueError):
        pass
    return {"case": name, "exit": proc.returncode, "kernels_sent": kernels,
            "kernels_counted": counted, "lost": lost, "peak_rss_mib": round(peak_rss / 1024, 1),
            "vmhwm_mib": round(hwm / 1024, 1), "wall_s": round(wall, 1),
            "stdout": out.strip()[-200:],
            "stderr_tail": err.strip().splitlines()[-1:] if proc.returncode else []}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpudiag", required=True)
    p.add_argument("--kernels", type=int, default=10_000_000)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--case", action="append",
                   choices=["idle", "few", "many", "nccl", "trace", "record", "paced"])
    args = p.parse_args()
    cases = args.case or ["idle", "few", "many", "nccl", "trace", "record"]
    with tempfile.TemporaryDirectory() as tmp:
        fake, driver = build(tmp)
        print(f"{'case':8} {'exit':>4} {'sent':>11} {'counted':>11} {'peak RSS MiB':>12} "
              f"{'VmHWM MiB':>10} {'wall s':>7}  lost")
        for name in cases:
            r = run_case(args, name, fake, driver, tmp)
            print(f"{r['case']:8} {r['exit']:>4} {r['kernels_sent']:>11,} "
                  f"{r['kernels_counted'] if r['kernels_counted'] is not None else '-':>11} "
                  f"{r['peak_rss_mib']:>12} {r['vmhwm_mib']:>10} {r['wall_s']:>7}  {r['lost']}"
                  f"{'  ' + str(r['stderr_tail']) if r['stderr_tail'] else ''}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
