#!/usr/bin/env bash
# Records each workload of benches/workloads/job.py under torchrun on the first N GPUs of a GPU
# host and checks the recordings: the measured runs the job verdict's thresholds come from.
#
#   benches/job_verdicts.sh GPUDIAG_BINARY N OUTDIR [MODE ...]
#
# For each mode: start the job, wait until every rank has warmed up, record its GPUs for 20 s
# at 500 ms, let the job end, then `check --replay` the recording (text and JSON). Writes
# OUTDIR/N-MODE.{ndjson.gz,log,check.txt,check.json}. Prints one line a mode: the job verdict
# and the straggler `check` named. benches/job_verdicts.py turns OUTDIR into the table in
# benches/RESULTS.md.
set -uo pipefail
bin=${1:?usage: job_verdicts.sh GPUDIAG_BINARY N OUTDIR [MODE ...]}
n=${2:?usage}
out=${3:?usage}
shift 3
modes=${*:-balanced slow13 slow2 cpu_starved shared comm pipeline}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
devices=()
for ((i = 0; i < n; i++)); do devices+=(--device "$i"); done
for mode in $modes; do
  ready=$(mktemp -u)
  python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
    "$here/workloads/job.py" "$mode" --seconds 32 --ready "$ready" >"$out/$n-$mode.log" 2>&1 &
  job=$!
  for _ in $(seq 900); do [ -e "$ready" ] && break; sleep 0.1; done
  if [ ! -e "$ready" ]; then
    echo "$n-$mode: the job did not start (see $out/$n-$mode.log)"
    kill "$job" 2>/dev/null
    wait "$job"
    continue
  fi
  sleep 2
  "$bin" record "${devices[@]}" --output "$out/$n-$mode.ndjson.gz" --force --interval 500ms \
    --duration 20s 2>>"$out/$n-$mode.log"
  wait "$job"
  rm -f "$ready"
  "$bin" check --replay "$out/$n-$mode.ndjson.gz" >"$out/$n-$mode.check.txt" 2>&1
  "$bin" check --replay "$out/$n-$mode.ndjson.gz" --json >"$out/$n-$mode.check.json" 2>/dev/null
  python3 - "$out/$n-$mode.check.json" "$n-$mode" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
jobs = r.get("jobs") or []
if not jobs:
    print(f"{sys.argv[2]}: no job verdict; not judged: "
          + "; ".join(n["reason"] for n in r.get("not_judged", []) if n["rule"] == "job"))
for j in jobs:
    s = j.get("straggler") or {}
    print(f"{sys.argv[2]}: {j['verdict']} straggler={s.get('device')} "
          f"wait={s.get('peers_wait_share')} :: {j['title']}")
EOF
done
