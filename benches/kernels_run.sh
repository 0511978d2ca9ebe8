#!/usr/bin/env bash
# `gpudiag run --kernels` on a GPU host with PyTorch (issue 37): what it names against what
# torch.profiler names for the same loops, what it costs, and whether the user's own profiler
# keeps its trace.
#
#   KRUN_PART=single benches/kernels_run.sh [GPUDIAG_BINARY]   about 7 minutes, one GPU
#   KRUN_PART=ddp    benches/kernels_run.sh [GPUDIAG_BINARY]   about 3 minutes, two GPUs or more
#   KRUN_PART=smoke  benches/kernels_run.sh [GPUDIAG_BINARY]   under a minute: one loop, one report
#   KRUN_PART=cost   benches/kernels_run.sh [GPUDIAG_BINARY]   about 3 minutes, one GPU
#
# single: for each loop of benches/kernels_run/workloads.py (sync, launch, pageable, resnet,
#   gpt2; KRUN_MODES picks): steps a second under `run` and under `run --kernels`, two rounds
#   interleaved; the run report of the --kernels runs; torch.profiler's top kernels, copies and
#   syncs of the same loop (TOP_OUT); then the user's own torch.profiler inside `run --kernels`
#   (both traces whole?).
# ddp: torchrun on two GPUs (benches/workloads/job.py), balanced, rank 1 doing 1.04x and 1.3x
#   the work (KRUN_DDP_MODES), under `run` and `run --kernels` (KRUN_HOWS: plain kernels
#   sample), KRUN_ROUNDS rounds (default 2): ms a step, each rank's NCCL time, the order of
#   arrivals, the job verdict.
# cost: ResNet-50 training at batch 64 and 256, and the launch loop: steps a second under `run`,
#   under `run --kernels`, under `run --kernels=sample` (KRUN_SAMPLE gives another mode, e.g.
#   sample:1s/10s; a setting `sample:ON/PERIOD` in KRUN_HOWS names its own), and under
#   torch.profiler recording CUDA activity only (no gpudiag), KRUN_ROUNDS rounds (default 1)
#   interleaved; KRUN_LOADS picks loops (MODE:BATCH ...; a ddp_ mode runs under torchrun on
#   KRUN_GPUS GPUs, default 2), KRUN_HOWS the settings; runs.txt has one line each (printed as
#   each run ends). With the default schedule (1 s of every 30 s) give KRUN_SECONDS=30 or
#   more, so each timed run holds a whole period. Every run logs its steps (steps/NAME.json),
#   and sampling.txt reads the cost of each sampled run inside it, against its own steps away
#   from the windows (benches/kernels_run/sampling_cost.py; the plain runs read against the
#   default schedule are the control).
# Everything lands in $OUT/kernels_run.tar.gz; benches/kernels_run/compare.py prints the tables.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-.gpu-bundle/gpudiag}")
out=${OUT:-$PWD/kernels-run-out}
here=$PWD/benches/kernels_run
work=$(mktemp -d)
dir=$work/kernels_run
mkdir -p "$dir/reports" "$dir/logs" "$dir/refs" "$dir/traces" "$dir/steps" "$out"
{
  date -u +'%Y-%m-%dT%H:%M:%SZ'
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  "$bin" --version
} >"$dir/host.txt" 2>&1
cat "$dir/host.txt"
part=${KRUN_PART:-single}
secs=${KRUN_SECONDS:-8}

one() { # NAME KERNELS(0|1|sample|sample:ON/PERIOD) -- COMMAND...
  local name=$1 kernels=$2
  shift 3
  local flags=()
  [ "$kernels" = 1 ] && flags=(--kernels --trace "$dir/traces/$name.json")
  [ "$kernels" = sample ] && kernels=${KRUN_SAMPLE:-sample}
  [ "${kernels#sample}" != "$kernels" ] && flags=("--kernels=$kernels" --trace "$dir/traces/$name.json")
  timeout 300 "$bin" run "${flags[@]}" --report-file "$dir/reports/$name.json" -- "$@" \
    >"$dir/logs/$name.out" 2>"$dir/logs/$name.err"
  echo "$name rc=$? $(tail -n1 "$dir/logs/$name.out")" | tee -a "$dir/runs.txt"
}

if [ "$part" = smoke ]; then
  one smoke-sync 1 -- python3 "$here/workloads.py" sync 4
  tail -n 40 "$dir/logs/smoke-sync.err"
fi

if [ "$part" = single ]; then
  for mode in ${KRUN_MODES:-sync launch pageable resnet gpt2}; do
    TOP_OUT="$dir/refs/$mode.json" python3 "$here/workloads.py" "$mode" 3 \
      >"$dir/logs/ref-$mode.out" 2>"$dir/logs/ref-$mode.err"
    for round in 1 2; do
      one "$mode-plain-$round" 0 -- python3 "$here/workloads.py" "$mode" "$secs"
      one "$mode-kernels-$round" 1 -- python3 "$here/workloads.py" "$mode" "$secs"
    done
  done
  # The user's own torch.profiler inside the command, with and without --kernels.
  mkdir -p "$dir/traces/profiler-plain" "$dir/traces/profiler-kernels"
  python3 "$here/workloads.py" profiler "$dir/traces/profiler-plain" \
    >"$dir/logs/profiler-plain.out" 2>"$dir/logs/profiler-plain.err"
  echo "profiler-plain rc=$? $(tail -n1 "$dir/logs/profiler-plain.out")" | tee -a "$dir/runs.txt"
  one profiler-kernels 1 -- python3 "$here/workloads.py" profiler "$dir/traces/profiler-kernels"
fi

if [ "$part" = cost ]; then
  for round in $(seq "${KRUN_ROUNDS:-1}"); do
    for load in ${KRUN_LOADS:-resnet:64 resnet:256 launch:0}; do
      mode=${load%%:*} batch=${load##*:}
      launch=(python3)
      # DDP loads run one process a GPU under torchrun.
      [ "${mode#ddp_}" != "$mode" ] && launch=(torchrun --standalone --nproc-per-node "${KRUN_GPUS:-2}")
      for how in ${KRUN_HOWS:-plain kernels sample profiler}; do
        name="cost-$mode-$batch-${how//[:\/]/_}-$round"
        export KRUN_BATCH=$batch KRUN_STEP_LOG="$dir/steps/$name.json"
        case $how in
          plain) one "$name" 0 -- "${launch[@]}" "$here/workloads.py" "$mode" "$secs" ;;
          kernels) one "$name" 1 -- "${launch[@]}" "$here/workloads.py" "$mode" "$secs" ;;
          sample*) one "$name" "$how" -- "${launch[@]}" "$here/workloads.py" "$mode" "$secs" ;;
          profiler)
            KRUN_UNDER_PROFILER=1 "${launch[@]}" "$here/workloads.py" "$mode" "$secs" \
              >"$dir/logs/$name.out" 2>"$dir/logs/$name.err"
            echo "$name rc=$? $(tail -n1 "$dir/logs/$name.out")" | tee -a "$dir/runs.txt" ;;
        esac
        # The schedule each run is read against: its own, or the default for the control.
        schedule=1/30
        [ "$how" = sample ] && [ -n "${KRUN_SAMPLE:-}" ] && how=$KRUN_SAMPLE
        case $how in
          sample:*) schedule=${how#sample:} schedule=${schedule//s/} ;;
          kernels | profiler) schedule= ;;
        esac
        [ -n "$schedule" ] && [ -f "$KRUN_STEP_LOG" ] &&
          python3 "$here/sampling_cost.py" "$KRUN_STEP_LOG:$schedule" | tee -a "$dir/sampling.txt"
      done
      unset KRUN_BATCH KRUN_STEP_LOG
    done
  done
fi

if [ "$part" = ddp ]; then
  job=$PWD/benches/workloads/job.py
  for round in $(seq "${KRUN_ROUNDS:-2}"); do
    for mode in ${KRUN_DDP_MODES:-balanced slow105 slow13}; do
      for how in ${KRUN_HOWS:-plain kernels}; do
        flag=0
        [ "$how" = kernels ] && flag=1
        [ "$how" = sample ] && flag=sample
        one "ddp-$mode-$how-$round" "$flag" -- torchrun --standalone --nproc-per-node 2 \
          "$job" "$mode" --seconds "${KRUN_DDP_SECONDS:-15}" --slow-rank 1
      done
    done
  done
fi

rm -f "$dir"/traces/*.json.tmp
# Traces are large: keep the ones of the first round only.
rm -f "$dir"/traces/*-2.json
python3 "$here/compare.py" "$dir" | tee "$dir/summary.txt"
tar -czf "$out/kernels_run.tar.gz" -C "$work" kernels_run
