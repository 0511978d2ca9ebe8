#!/usr/bin/env bash
# The feasibility gate of `run --kernels` (issue 37), on a GPU host with PyTorch, about 4 minutes:
#
#   benches/kernels_gate.sh [GPUDIAG_BINARY]
#   GATE_PART=second benches/kernels_gate.sh [GPUDIAG_BINARY]   about 4 minutes: three rounds of the
#       launch-heavy loop (base, collector, 10% duty cycle by kinds and by detaching CUPTI,
#       Kineto) and the torch.profiler runs, nothing else
#   GATE_PART=profiler benches/kernels_gate.sh                  about 1 minute: the torch.profiler
#       runs alone
#
# 1. cost: steps/s of a launch-heavy loop (40 small elementwise kernels and one .item() a step)
#    without a collector, with the collector under several settings (activity kinds, buffer size,
#    duty cycle, loaded by injection alone or also preloaded), and under torch.profiler recording
#    CUDA activity only (Kineto's own cost, the reference); two rounds, interleaved; a bf16
#    matmul loop and a copy loop with and without the collector.
# 2. torch.profiler beside the collector: the kernels in two torch.profiler traces of one script
#    without a collector, with the collector loaded by injection only (the naive way) and also
#    preloaded (Kineto's calls go through the collector, which steps aside while Kineto traces),
#    and what the collector counted.
# 3. a missing path: CUDA_INJECTION64_PATH and LD_PRELOAD naming a file that does not exist; a
#    CUDA program that loads no libcupti (CuPy).
# 4. gpudiag's profiling counters (GPM) while the collector records.
# Everything lands in $OUT/kernels_gate.tar.gz; the summary is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-.gpu-bundle/gpudiag}
out=${OUT:-$PWD/kernels-gate-out}
here=$PWD/benches/kernels_gate
work=$(mktemp -d)
dir=$work/kernels_gate
mkdir -p "$dir/summaries" "$dir/traces" "$out"
say() { echo "$*" | tee -a "$dir/summary.txt"; }
{
  date -u +'%Y-%m-%dT%H:%M:%SZ'
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$dir/host.txt" 2>&1
cat "$dir/host.txt"

# Built here against the toolkit's CUPTI headers (the gate only; see collector.c).
inc=""
for d in /usr/local/cuda/extras/CUPTI/include /usr/local/cuda/include; do
  [ -e "$d/cupti.h" ] && inc="$inc -I$d"
done
[ -e /usr/local/cuda/include/cuda.h ] && inc="$inc -I/usr/local/cuda/include"
so=$work/libgpudiag_collector.so
if ! gcc -O2 -Wall -fPIC -shared -fvisibility=hidden $inc -o "$so" "$here/collector.c" -ldl -lpthread \
  2>"$dir/build.log"; then
  cat "$dir/build.log"
  exit 2
fi

run_one() { # NAME SETTINGS... -- WORKLOAD ARGS
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  mkdir -p "$dir/summaries/$name"
  env "${envs[@]}" GPUDIAG_KERNELS_OUT="$dir/summaries/$name" \
    python3 "$here/workload.py" "$@" >"$dir/summaries/$name/result.json" 2>"$dir/summaries/$name/stderr.txt"
  echo "$name rc=$? $(cat "$dir/summaries/$name/result.json")" >>"$dir/runs.txt"
}

inj="CUDA_INJECTION64_PATH=$so"
pre="LD_PRELOAD=$so"
secs=6
part=${GATE_PART:-all}
if [ "$part" = second ]; then
  secs=5
  for round in 1 2 3; do
    run_one "launch-base-$round" X=1 -- launch $secs
    run_one "launch-all-$round" "$inj" "$pre" -- launch $secs
    run_one "launch-all-duty10-$round" "$inj" "$pre" GPUDIAG_KERNELS_DUTY=100/1000 -- launch $secs
    run_one "launch-all-detach10-$round" "$inj" "$pre" GPUDIAG_KERNELS_DUTY=100/1000 \
      GPUDIAG_KERNELS_DETACH=1 -- launch $secs
    run_one "launch-kineto-$round" PROFILE_ALL=1 -- launch $secs
  done
fi
[ "$part" = all ] && for round in 1 2; do
  run_one "launch-base-$round" X=1 -- launch $secs
  run_one "launch-all-$round" "$inj" "$pre" -- launch $secs
  run_one "launch-all-injection-only-$round" "$inj" -- launch $secs
  run_one "launch-kernel-$round" "$inj" "$pre" GPUDIAG_KERNELS_KINDS=kernel -- launch $secs
  run_one "launch-kernel-sync-$round" "$inj" "$pre" GPUDIAG_KERNELS_KINDS=kernel,sync -- launch $secs
  run_one "launch-sync-$round" "$inj" "$pre" GPUDIAG_KERNELS_KINDS=sync -- launch $secs
  run_one "launch-memcpy-$round" "$inj" "$pre" GPUDIAG_KERNELS_KINDS=memcpy,memset -- launch $secs
  run_one "launch-all-256k-$round" "$inj" "$pre" GPUDIAG_KERNELS_BUFFER_KB=256 -- launch $secs
  run_one "launch-all-duty10-$round" "$inj" "$pre" GPUDIAG_KERNELS_DUTY=100/1000 -- launch $secs
  run_one "launch-kineto-$round" PROFILE_ALL=1 -- launch $secs
done
[ "$part" = all ] && {
run_one matmul-base X=1 -- matmul $secs
run_one matmul-all "$inj" "$pre" -- matmul $secs
run_one copies-base X=1 -- copies $secs
run_one copies-all "$inj" "$pre" -- copies $secs
}

mkdir -p "$dir/traces/none" "$dir/traces/injection-only" "$dir/traces/preloaded" "$dir/traces/noroute"
run_one profiler-none X=1 -- profiler "$dir/traces/none"
run_one profiler-injection-only "$inj" -- profiler "$dir/traces/injection-only"
run_one profiler-preloaded "$inj" "$pre" -- profiler "$dir/traces/preloaded"
run_one profiler-preloaded-teardown "$inj" "$pre" TEARDOWN_CUPTI=1 -- profiler "$dir/traces/preloaded"
rm -f "$dir"/traces/*/*.json.gz

[ "$part" = all ] && {
run_one missing-injection CUDA_INJECTION64_PATH=/nonexistent/libgpudiag_collector.so -- smoke
run_one missing-preload LD_PRELOAD=/nonexistent/libgpudiag_collector.so \
  CUDA_INJECTION64_PATH=/nonexistent/libgpudiag_collector.so -- smoke
python3 -c 'import cupy' 2>/dev/null && {
  mkdir -p "$dir/summaries/cupy"
  CUDA_INJECTION64_PATH=$so LD_PRELOAD=$so GPUDIAG_KERNELS_OUT="$dir/summaries/cupy" \
    GPUDIAG_KERNELS_VERBOSE=1 python3 -c 'import cupy; print(int(cupy.arange(4).sum()))' \
    >"$dir/summaries/cupy/result.json" 2>"$dir/summaries/cupy/stderr.txt"
  echo "cupy rc=$? $(cat "$dir/summaries/cupy/result.json")" >>"$dir/runs.txt"
}

}
if [ -x "$bin" ] && [ "$part" = all ]; then
  env "$inj" "$pre" GPUDIAG_KERNELS_OUT="$dir/summaries" python3 "$here/workload.py" launch 12 \
    >"$dir/gpm-workload.json" 2>&1 &
  wl=$!
  sleep 5
  "$bin" check --window 5s --json >"$dir/gpm-check.json" 2>"$dir/gpm-check.err"
  echo "gpm check rc=$?" >>"$dir/runs.txt"
  wait $wl
fi

python3 - "$dir" <<'EOF' | tee -a "$dir/summary.txt"
import glob, json, os, sys
d = sys.argv[1]
runs = {}
for line in open(os.path.join(d, "runs.txt")):
    name, rest = line.split(" ", 1)
    rc, _, body = rest.partition(" ")
    try:
        runs[name] = (rc, json.loads(body) if body.strip() else {})
    except ValueError:
        runs[name] = (rc, {"raw": body.strip()})
def summaries(name):
    out = []
    for p in glob.glob(os.path.join(d, "summaries", name, "*.json")):
        if p.endswith("result.json"):
            continue
        try:
            out.append(json.load(open(p)))
        except ValueError as e:
            out.append({"broken": str(e)})
    return out
print("== launch-heavy loop, steps/s (ratio to the base of the same round)")
for r in (1, 2, 3):
    base = runs.get(f"launch-base-{r}", ("", {}))[1].get("steps_per_s")
    for name in sorted(k for k in runs if k.startswith("launch-") and k.endswith(f"-{r}")):
        res = runs[name][1]
        rate = res.get("steps_per_s")
        s = summaries(name)
        k = s[0] if s else {}
        extra = ""
        if k:
            extra = (f" kernels={k.get('kernels')} syncs={k.get('syncs')} copies={k.get('copies')}"
                     f" buffers={k.get('buffers')} dropped={k.get('dropped')}"
                     f" detaches={k.get('detaches')}")
        if "profiler_cuda_events" in res:
            extra += f" kineto_cuda_events={res['profiler_cuda_events']}"
        ratio = f"{rate / base:.3f}" if rate and base else "-"
        print(f"{name:36} rc={runs[name][0][3:]} {rate and round(rate, 1)} x{ratio}{extra}")
for pair in (("matmul-base", "matmul-all"), ("copies-base", "copies-all")):
    a, b = (runs.get(p, ("", {}))[1].get("steps_per_s") for p in pair)
    s = summaries(pair[1])
    print(f"{pair[1]:36} {a and round(a, 2)} -> {b and round(b, 2)} x{b / a:.4f}" if a and b else pair,
          (s[0].get("kernels"), s[0].get("copies"), s[0].get("pageable_copies"), s[0].get("copy_by_kind")) if s else "")
print("== torch.profiler beside the collector")
for name in ("profiler-none", "profiler-injection-only", "profiler-preloaded", "profiler-preloaded-teardown",
             ):
    rc, res = runs.get(name, ("?", {}))
    s = summaries(name)
    k = s[0] if s else {}
    print(name, rc, [(t["session"], t["steps"], t["events"]) for t in res.get("traces", [])],
          {x: k.get(x) for x in ("kernels", "syncs", "guest_registrations", "finalize_calls",
                                 "dropped", "asides", "aside_ns")})
    if k.get("top"):
        print("   top:", [(t["name"][:40], t["count"]) for t in k["top"][:4]])
    err = os.path.join(d, "summaries", name, "stderr.txt")
    if os.path.exists(err):
        lines = [l for l in open(err).read().splitlines() if "UserWarning" not in l and "_warn_once" not in l]
        print("   stderr:", lines[-3:])
print("== missing paths and a program without libcupti")
for name in ("missing-injection", "missing-preload", "cupy"):
    if name in runs:
        err = open(os.path.join(d, "summaries", name, "stderr.txt")).read().strip()[-300:]
        print(name, runs[name][0], runs[name][1], "| stderr:", err, "| summaries:", summaries(name))
p = os.path.join(d, "gpm-check.json")
if os.path.exists(p):
    try:
        doc = json.load(open(p))
        g = doc["devices"][0]
        pick = {k: (v or {}).get("mean") for k, v in g["summary"].items()
                if k in ("gpu_util_pct", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct")}
        v = g.get("verdict") or {}
        print("== gpm under the collector:", pick, v.get("bottleneck"), v.get("basis"), v.get("title"))
    except ValueError as e:
        print("gpm check not JSON", e, open(p).read()[:300])
EOF
tar -C "$work" -czf "$out/kernels_gate.tar.gz" kernels_gate
