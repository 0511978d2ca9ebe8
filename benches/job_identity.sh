#!/usr/bin/env bash
# The live checks of which processes form a job (issue 35), on a GPU host of 4 GPUs (or 2):
#
#   a. two torchrun jobs on torchrun's defaults (no --standalone, no --rdzv args: run id
#      "none", master 127.0.0.1:29500 in both), each on its own GPUs and in its own network
#      namespace (`unshare -n` as root, else `unshare -rn`; lo brought up inside). The first
#      does twice the work on its rank 0 (job.py slow2), the second is balanced. Where the host
#      refuses a network namespace, two jobs on the host's with distinct --master-port (29500,
#      29501); the summary says which ran. `check --json --window 30s` runs alongside.
#      Right: two jobs (never one of both jobs' GPUs), the second's GPUs waiting for nobody.
#      On 2 GPUs each job has one GPU, so neither is a multi-GPU job: right is no job at all.
#   b. the PyTorch DDP tutorial's shape (benches/workloads/ddp_spawn.py: mp.spawn, MASTER_ADDR
#      set in the children after they start) with rank 1 doing twice the work, `check --json
#      --window 30s` alongside. Right: one job joined by its parent, GPU 1 its straggler.
#   c. a torchrun job (--standalone) with a 2x straggler on rank 1, the terminal UI at 80x24 in
#      tmux (its first screen and its peers view, `j`), and `check --json --window 30s`
#      alongside. Right: the header, the Job panel and check agree on who waits.
#
#   benches/job_identity.sh [GPUDIAG_BINARY]     (default .gpu-bundle/gpudiag)
#
# From the repository root on the GPU host (see scripts/gpu-tests and docs/development.md for
# the bundle). Needs python3 with torch; no network. Writes everything (each check's JSON and
# text, each job's log, the UI's screens, summary.txt) under $OUT as job_identity.tar.gz
# ($OUT defaults to ./job-identity-out) and prints summary.txt. Each part is bounded by
# `timeout`: about 5 minutes in all on 4 H100s, under 9 in the worst case.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-.gpu-bundle/gpudiag}
out=${OUT:-$PWD/job-identity-out}
here=$PWD/benches

[ -x "$bin" ] || { echo "job_identity: no gpudiag at $bin (scripts/gpu-tests pack)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$gpus" -lt 2 ]; then
  echo "job_identity: needs 2 GPUs or more, found ${gpus:-none}" >&2
  exit 2
fi
work=$(mktemp -d)
dir=$work/job_identity
mkdir -p "$dir" "$out"
summary=$dir/summary.txt
say() { echo "$*" | tee -a "$summary"; }
# Each job of part a gets half of at most four GPUs; parts b and c use as many.
half=$((gpus >= 4 ? 2 : 1))
n=$((half * 2))
# The jobs run this long after warming up: a 30 s window, and the time check takes to start.
job_s=45

{
  date -u +'%Y-%m-%dT%H:%M:%SZ'
  "$bin" --version
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  uname -r
  id -u
} >"$dir/host.txt" 2>&1
say "host: $gpus GPUs ($(nvidia-smi --query-gpu=name --format=csv,noheader | sort -u | tr '\n' ' ')); using $n"

# Waits (up to 150 s) until FILE exists: the job's rank 0 touches it once every rank has warmed up.
wait_ready() {
  for _ in $(seq 1500); do [ -e "$1" ] && return 0; sleep 0.1; done
  return 1
}

# One line a job and a line of GPU verdicts from a check report (old and new report shapes).
summarise() { # NAME CHECK_JSON
  python3 - "$@" <<'EOF' | tee -a "$summary"
import json, sys
name, path = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(path))
except Exception as e:  # an empty or partial file: say so, the tarball has the rest
    print(f"{name}: no report ({e})")
    sys.exit(0)
jobs = r.get("jobs") or []
if not jobs:
    why = "; ".join(n["reason"] for n in r.get("not_judged", []) if n["rule"] == "job")
    print(f"{name}: no job" + (f" (not judged: {why})" if why else ""))
for j in jobs:
    stragglers = j.get("stragglers")
    if stragglers is None:
        stragglers = [j["straggler"]] if j.get("straggler") else []
    named = ",".join(f"{s['device']}:{s['pace']}" for s in stragglers) or "none"
    roles = " ".join(f"{m['device']}={m.get('role') or '-'}" for m in j["members"])
    print(f"{name}: job {j['job']['joined_by']} {j['job']['key']!r} GPUs "
          f"{[m['device'] for m in j['members']]} ranks {[m.get('rank') for m in j['members']]}: "
          f"{j['verdict']} ({j['confidence']}{', presumed' if j.get('presumed') else ''}) "
          f"stragglers {named} roles {roles} doubts {j.get('doubts', [])}")
    print(f"{name}:   {j['title']}")
    for s in stragglers:
        print(f"{name}:   GPU {s['device']} differs: {s.get('differs')}; "
              f"peers wait {s.get('peers_wait_share')}")
gpus = " ".join(f"{d['info']['index']}={(d.get('verdict') or {}).get('bottleneck')}"
                for d in r.get("devices", []))
print(f"{name}: GPU verdicts {gpus}")
for n in r.get("not_judged", []):
    if n["rule"] == "job" or "evict" in n["reason"]:
        print(f"{name}: not judged ({n['rule']}): {n['reason']}")
EOF
}

# `check --json` and `check` over 30 s, side by side, into PREFIX.json / PREFIX.txt.
check_window() { # PREFIX
  timeout 90 "$bin" --config /dev/null check --window 30s --json >"$1.json" 2>"$1.err" &
  local checking=$!
  timeout 90 "$bin" --config /dev/null check --window 30s >"$1.txt" 2>&1
  wait "$checking"
}

# Brings lo up in the current network namespace: `ip` where there is one, else an ioctl.
lo_up='if command -v ip >/dev/null; then ip link set lo up; else python3 -c "
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifr = fcntl.ioctl(s, 0x8913, struct.pack(\"16sH14s\", b\"lo\", 0, b\"\"))
flags = struct.unpack(\"16sH14s\", ifr)[1]
fcntl.ioctl(s, 0x8914, struct.pack(\"16sH14s\", b\"lo\", flags | 1, b\"\"))
"; fi'

# --- a. two jobs on torchrun's defaults ------------------------------------------------------
netns=""
for cmd in "unshare -n" "unshare -rn"; do
  if $cmd bash -c "$lo_up" >/dev/null 2>&1; then
    netns=$cmd
    break
  fi
done
first=$(seq -s, 0 $((half - 1)))
second=$(seq -s, "$half" $((n - 1)))
ready_a=$(mktemp -u)
ready_b=$(mktemp -u)
# torchrun's defaults: no --standalone, no --rdzv-* (run id "none", 127.0.0.1:29500).
defaults_job() { # GPUS READY LOG PORT_ARGS MODE [ARGS]
  local devices=$1 ready=$2 log=$3 port=$4 mode=$5
  shift 5
  local run="python3 -m torch.distributed.run --nproc-per-node $half $port $here/workloads/job.py \
$mode --seconds $job_s --ready $ready $*"
  if [ -n "$netns" ]; then
    # A new namespace has only lo, which NCCL would rather not use unless told.
    CUDA_VISIBLE_DEVICES=$devices NCCL_SOCKET_IFNAME=lo timeout 200 \
      $netns bash -c "$lo_up && exec $run" >"$log" 2>&1 &
  else
    CUDA_VISIBLE_DEVICES=$devices timeout 200 bash -c "exec $run" >"$log" 2>&1 &
  fi
}
if [ -n "$netns" ]; then
  say "a: each job in its own network namespace ($netns), both on 127.0.0.1:29500"
  defaults_job "$first" "$ready_a" "$dir/a-first.log" "" slow2 --slow-rank 0
  job_a=$!
  defaults_job "$second" "$ready_b" "$dir/a-second.log" "" balanced
  job_b=$!
else
  say "a: the host refused a network namespace (unshare -n, unshare -rn): two jobs in the host's, on ports 29500 and 29501"
  defaults_job "$first" "$ready_a" "$dir/a-first.log" "--master-port 29500" slow2 --slow-rank 0
  job_a=$!
  defaults_job "$second" "$ready_b" "$dir/a-second.log" "--master-port 29501" balanced
  job_b=$!
fi
if wait_ready "$ready_a" && wait_ready "$ready_b"; then
  sleep 2
  # Which namespace each rank runs in, for the summary.
  for p in $(pgrep -f "workloads/job.py" || true); do
    echo "$p $(readlink "/proc/$p/ns/net" 2>/dev/null) $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-160)"
  done >"$dir/a-processes.txt"
  check_window "$dir/a-check"
  say "a: first job on GPUs $first (slow2, rank 0), second on GPUs $second (balanced)"
  summarise a "$dir/a-check.json"
else
  say "a: the jobs did not warm up in 150 s (see a-first.log, a-second.log)"
fi
wait "$job_a" "$job_b" 2>/dev/null
rm -f "$ready_a" "$ready_b"

# --- b. mp.spawn, the DDP tutorial's shape -----------------------------------------------------
ready=$(mktemp -u)
CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout 200 python3 "$here/workloads/ddp_spawn.py" "$n" \
  slow2 --slow-rank 1 --seconds "$job_s" --ready "$ready" >"$dir/b-spawn.log" 2>&1 &
job=$!
if wait_ready "$ready"; then
  sleep 2
  for p in $(pgrep -f "multiprocessing" || true); do
    echo "$p ppid $(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-160)"
    echo "  environ names MASTER_ADDR: $(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -c '^MASTER_ADDR=')"
  done >"$dir/b-processes.txt"
  check_window "$dir/b-check"
  say "b: mp.spawn on $n GPUs, rank 1 does twice the work"
  summarise b "$dir/b-check.json"
else
  say "b: the mp.spawn job did not warm up in 150 s (see b-spawn.log)"
fi
wait "$job" 2>/dev/null
rm -f "$ready"

# --- c. a 2x straggler under torchrun, the UI at 80x24 -------------------------------------------
ready=$(mktemp -u)
CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout 200 python3 -m torch.distributed.run --standalone \
  --nproc-per-node "$n" "$here/workloads/job.py" slow2 --slow-rank 1 --seconds 60 \
  --ready "$ready" >"$dir/c-torchrun.log" 2>&1 &
job=$!
if wait_ready "$ready"; then
  sleep 2
  if command -v tmux >/dev/null; then
    # A socket of its own: never another tmux server on the host.
    ui="tmux -L gpudiag-job-identity"
    $ui kill-server 2>/dev/null
    $ui new -d -s ui -x 80 -y 24 "$bin --config /dev/null"
    check_window "$dir/c-check"
    $ui capture-pane -p -t ui >"$dir/c-tui-80x24.txt"
    $ui send-keys -t ui j
    sleep 2
    $ui capture-pane -p -t ui >"$dir/c-tui-80x24-peers.txt"
    $ui send-keys -t ui q
    sleep 1
    $ui kill-server 2>/dev/null
    say "c: torchrun slow2 on $n GPUs (rank 1), the UI at 80x24 after 30 s:"
    tee -a "$summary" <"$dir/c-tui-80x24.txt"
    say "c: its peers view (j):"
    tee -a "$summary" <"$dir/c-tui-80x24-peers.txt"
  else
    say "c: no tmux on this host: the UI was not captured"
    check_window "$dir/c-check"
  fi
  summarise c "$dir/c-check.json"
else
  say "c: the torchrun job did not warm up in 150 s (see c-torchrun.log)"
fi
wait "$job" 2>/dev/null
rm -f "$ready"

tar czf "$out/job_identity.tar.gz" -C "$work" job_identity
rm -rf "$work"
echo "job_identity: $out/job_identity.tar.gz"
