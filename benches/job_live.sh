#!/usr/bin/env bash
# Every live view of the job verdict on a GPU host, on real torchrun jobs (benches/workloads/job.py):
# `run` (cpu_starved), `check --window 20s` (slow13), `serve` scraped twice (shared), `trace`
# (slow2) and the terminal UI in tmux at 200x60 and 80x24 with its peers view (slow2).
#
#   benches/job_live.sh GPUDIAG_BINARY N OUTDIR
#
# Writes each view's output under OUTDIR and prints a line per view.
set -uo pipefail
bin=${1:?usage: job_live.sh GPUDIAG_BINARY N OUTDIR}
n=${2:?usage}
out=${3:?usage}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
torchrun() { python3 -m torch.distributed.run --standalone --nproc-per-node "$n" "$here/workloads/job.py" "$@"; }
start_job() { # MODE SECONDS: starts a job, waits until it has warmed up
  local ready
  ready=$(mktemp -u)
  torchrun "$1" --seconds "$2" --ready "$ready" >"$out/$1.log" 2>&1 &
  job=$!
  for _ in $(seq 900); do [ -e "$ready" ] && break; sleep 0.1; done
  sleep 2
}
devices=()
for ((i = 0; i < n; i++)); do devices+=(--device "$i"); done

"$bin" run --report-file "$out/run.json" -- python3 -m torch.distributed.run --standalone \
  --nproc-per-node "$n" "$here/workloads/job.py" cpu_starved --seconds 25 >"$out/run.txt" 2>&1
echo "run: $(grep -m1 'job verdict' "$out/run.txt")"

start_job slow13 32
"$bin" check "${devices[@]}" >"$out/check-default-window.txt" 2>&1
"$bin" check "${devices[@]}" --window 20s --json >"$out/check.json" 2>"$out/check.err" &
checking=$!
"$bin" check "${devices[@]}" --window 20s >"$out/check.txt" 2>&1
wait "$checking"
wait "$job"
echo "check: $(grep -m1 'job verdict' "$out/check.txt")"
echo "check, default window: $(grep -m1 'not judged: job' "$out/check-default-window.txt")"

start_job shared 40
"$bin" serve "${devices[@]}" --listen 127.0.0.1:9477 >"$out/serve.log" 2>&1 &
serve=$!
sleep 25
curl -s 127.0.0.1:9477/metrics >"$out/metrics.txt"
kill "$serve"
wait "$serve" "$job"
echo "serve: $(grep -E '^gpudiag_job_verdict|^gpudiag_verdict\{' "$out/metrics.txt" | tr '\n' ' ' | cut -c1-600)"

start_job slow2 130
"$bin" trace "${devices[@]}" --duration 20s --output "$out/trace.json" >"$out/trace.log" 2>&1
echo "trace: $(python3 -c "
import json,sys
t=json.load(open('$out/trace.json'))
print([e['name'] for e in t['traceEvents'] if e.get('cat')=='job,overall'])")"
if command -v tmux >/dev/null; then
  for size in 200x60 80x24; do
    tmux kill-server 2>/dev/null
    tmux new-session -d -s ui -x "${size%x*}" -y "${size#*x}" "$bin"
    sleep 40
    tmux send-keys -t ui j
    sleep 2
    tmux capture-pane -p -t ui >"$out/tui-peers-$size.txt"
    tmux send-keys -t ui q
    sleep 1
    tmux kill-server 2>/dev/null
  done
  echo "tui: $(grep -c 'GPU' "$out/tui-peers-200x60.txt") lines naming a GPU at 200x60"
else
  echo "tui: no tmux on this host"
fi
wait "$job"
