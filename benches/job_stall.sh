#!/usr/bin/env bash
# Jobs that stop making progress, and jobs slowed by a known factor, recorded on a GPU host of 4
# GPUs, with NCCL's RAS service asked along the way (issue 36):
#
#   benches/job_stall.sh scenarios [GPUDIAG_BINARY]   about 5 minutes
#     hung4       4 GPUs under torchrun; rank 3 stops calling the all-reduce 20 s in and sleeps
#     stop+kill   two 2-GPU jobs at once: in one (torchrun) rank 1 gets SIGSTOP; in the other
#                 (ranks started one by one, no launcher to tear them down) rank 1 gets SIGKILL
#     ckpt+sub    two 2-GPU jobs at once: rank 0 of one spends 60 s writing a checkpoint on the
#                 host while its peer waits; the other is balanced with a second communicator
#   benches/job_stall.sh live [GPUDIAG_BINARY]        about 4 minutes
#     what each view says while a stall lasts: a hang under `gpudiag run` and a rank SIGKILLed
#     with no launcher (round 1), a rank stopped and a rank-0 checkpoint (round 2); `check
#     --window 30s` (text and JSON), `serve`'s /metrics and the terminal UI at 100x30 about 45 s
#     after each fault, and `run`'s summary once the hung job is ended
#   benches/job_stall.sh sensitivity [GPUDIAG_BINARY] about 7 minutes
#     matmul DDP on 2 GPUs (balanced twice; rank 1 slowed 1.05, 1.1, 1.2, 1.3x), on 4 GPUs
#     (balanced; rank 3 slowed 1.1, 1.2x), and timm ResNet-50 DDP on 2 GPUs (balanced; 1.1, 1.2,
#     1.3x), two 2-GPU jobs at a time
#
# Each round is one recording of every GPU (`gpudiag record`, 250 ms) with a <name>.truth.json
# beside it: which GPUs each job ran on, what was done to which rank and when (ms since the
# epoch). `check --window 30s --json` runs while each stall lasts; RAS answers go to ras/ with
# the exact bytes (benches/workloads/ras_capture.py). Everything lands in $OUT/job_stall.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?scenarios or sensitivity}
bin=${2:-.gpu-bundle/gpudiag}
out=${OUT:-$PWD/job-stall-out}
[ -x "$bin" ] || { echo "job_stall: no gpudiag at $bin" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
need=4; [ "$part" = live-hang ] && need=2
[ "$gpus" -ge $need ] || { echo "job_stall: needs $need GPUs, found ${gpus:-none}" >&2; exit 2; }
work=$(mktemp -d)
dir=$work/job_stall
mkdir -p "$dir/ras" "$dir/logs" "$dir/pids" "$out"
wl=$PWD/benches/workloads
now() { date +%s%3N; }
say() { echo "$(date -u +%T) $*" | tee -a "$dir/summary.txt"; }
{
  date -u +'%Y-%m-%dT%H:%M:%SZ'; "$bin" --version
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
} >"$dir/host.txt" 2>&1

record_start() { # NAME
  "$bin" record -o "$dir/$1.ndjson.gz" --interval 250ms >"$dir/logs/$1.record.log" 2>&1 &
  rec_pid=$!
  sleep 3
}
record_stop() {
  kill -INT "$rec_pid" 2>/dev/null; wait "$rec_pid" 2>/dev/null
}
wait_file() { # FILE SECONDS
  local i=0
  while [ ! -e "$1" ] && [ $i -lt $(($2 * 2)) ]; do sleep 0.5; i=$((i + 1)); done
  [ -e "$1" ]
}
ras() { # NAME: the three forms one after another (a status query is a collective over the
  # job: asked at once they would wait on each other), in the background, each bounded
  local n=$1
  (
    echo "$n: asked at $(now) ms" >>"$dir/ras/README.txt"
    python3 "$wl/ras_capture.py" "$dir/ras/$n-verbose.txt" --deadline 30 \
      "CLIENT PROTOCOL 2" "TIMEOUT 5" "VERBOSE STATUS"
    python3 "$wl/ras_capture.py" "$dir/ras/$n-status.txt" --deadline 30 \
      "CLIENT PROTOCOL 2" "TIMEOUT 5" "STATUS"
    python3 "$wl/ras_capture.py" "$dir/ras/$n-json.txt" --deadline 30 \
      "CLIENT PROTOCOL 2" "TIMEOUT 5" "SET FORMAT json" "STATUS"
  ) &
}
check() { # NAME: the check of the last 30 s, live, in the background
  timeout 60 "$bin" check --window 30s --json >"$dir/$1.check.json" 2>"$dir/logs/$1.check.err" &
}
# torchrun job on GPUS (comma list), master port PORT, then stall.py args.
torchrun_job() { # NAME GPUS PORT ARGS...
  local name=$1 gpus=$2 port=$3; shift 3
  local n; n=$(echo "$gpus" | tr ',' '\n' | wc -l)
  CUDA_VISIBLE_DEVICES=$gpus timeout 700 torchrun --nproc-per-node "$n" --master-port "$port" \
    --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "$name" \
    "$wl/stall.py" "$@" --ready "$dir/$name.ready" >"$dir/logs/$name.log" 2>&1 &
  eval "job_${name//-/_}=$!"
}
# The same ranks started one by one: no launcher tears the others down when one dies.
loose_job() { # NAME GPUS PORT ARGS...
  local name=$1 gpus=$2 port=$3; shift 3
  local list; IFS=, read -r -a list <<<"$gpus"
  local world=${#list[@]} r
  for r in $(seq 0 $((world - 1))); do
    CUDA_VISIBLE_DEVICES=${list[$r]} RANK=$r LOCAL_RANK=0 WORLD_SIZE=$world \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 700 python3 "$wl/stall.py" "$@" \
      --ready "$dir/$name.ready" >"$dir/logs/$name.$r.log" 2>&1 &
    echo $! >"$dir/pids/$name.$r"
  done
}
# The pid of rank R of a torchrun job: the python holding GPU G (nvidia-smi's host pid).
pid_on_gpu() { # GPU
  nvidia-smi --query-compute-apps=pid --format=csv,noheader -i "$1" | head -1 | tr -d ' '
}
stop_all() {
  pkill -CONT -f stall.py 2>/dev/null
  pkill -KILL -f stall.py 2>/dev/null
  pkill -KILL -f 'torchrun' 2>/dev/null
  sleep 3
}
truth() { # NAME JSON
  echo "$2" >"$dir/$1.truth.json"
}

scenarios() {
  # --- hung4 ---
  record_start hung4
  torchrun_job hung4 0,1,2,3 29501 hang --rank 3 --after 20 --seconds 600
  wait_file "$dir/hung4.ready" 120 || say "hung4: never ready"
  t_ready=$(now); sleep 8
  ras healthy-1; sleep 3; ras healthy-2
  sleep 9
  t_hang=$(now); say "hung4: rank 3 stops calling the all-reduce about now"
  sleep 10
  ras mismatch-1; sleep 3; ras mismatch-2
  sleep 22
  check hung4
  sleep 30
  t_end=$(now)
  stop_all; record_stop
  truth hung4 "{\"jobs\":[{\"gpus\":[0,1,2,3],\"case\":\"hung\",\"model\":\"matmul\",\"missing_device\":3,\"missing_rank\":3,\"ready_ms\":$t_ready,\"stall_from_ms\":$t_hang,\"end_ms\":$t_end}]}"

  # --- stop + kill ---
  record_start stopkill
  torchrun_job stop 0,1 29502 steady --seconds 600
  loose_job kill 2,3 29503 steady --seconds 600
  wait_file "$dir/stop.ready" 120; wait_file "$dir/kill.ready" 120
  t_ready=$(now); sleep 10
  ras twojobs-1; sleep 1; ras twojobs-2; sleep 1; ras twojobs-3; sleep 1; ras twojobs-4
  sleep 2
  stop_pid=$(pid_on_gpu 1); kill_pid=$(pid_on_gpu 3)
  t_stop=$(now); kill -STOP "$stop_pid"; kill -KILL "$kill_pid"
  say "stop: SIGSTOP pid $stop_pid (GPU 1); kill: SIGKILL pid $kill_pid (GPU 3)"
  echo "stop job: torchrun on GPUs 0,1, rank 1 pid $stop_pid SIGSTOP at $t_stop; kill job: ranks on GPUs 2,3, rank 1 pid $kill_pid SIGKILL at $t_stop; pids: $(nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader | tr '\n' ' ')" >>"$dir/ras/README.txt"
  sleep 10
  ras stopkill-1
  sleep 25
  check stopkill
  sleep 37
  ras stopkill-2
  sleep 25
  t_end=$(now)
  stop_all; record_stop
  truth stopkill "{\"jobs\":[{\"gpus\":[0,1],\"case\":\"stopped\",\"model\":\"matmul\",\"missing_device\":1,\"missing_rank\":1,\"pid\":$stop_pid,\"ready_ms\":$t_ready,\"stall_from_ms\":$t_stop,\"end_ms\":$t_end},{\"gpus\":[2,3],\"case\":\"exited\",\"model\":\"matmul\",\"missing_device\":3,\"missing_rank\":1,\"pid\":$kill_pid,\"ready_ms\":$t_ready,\"stall_from_ms\":$t_stop,\"end_ms\":$t_end}]}"

  # --- checkpoint + subgroup ---
  record_start ckptsub
  torchrun_job ckpt 0,1 29504 checkpoint --rank 0 --after 15 --pause 60 --seconds 95
  torchrun_job sub 2,3 29505 steady --subgroup --seconds 95
  wait_file "$dir/ckpt.ready" 120; wait_file "$dir/sub.ready" 120
  t_ready=$(now)
  sleep 10; ras multicomm-1
  sleep 5; t_pause=$(now)
  sleep 35
  check ckpt; ras ckpt-pause
  sleep 40
  wait "$job_ckpt" "$job_sub" 2>/dev/null
  t_end=$(now)
  stop_all; record_stop
  truth ckptsub "{\"jobs\":[{\"gpus\":[0,1],\"case\":\"checkpoint\",\"model\":\"matmul\",\"missing_device\":0,\"missing_rank\":0,\"ready_ms\":$t_ready,\"stall_from_ms\":$t_pause,\"stall_to_ms\":$((t_pause + 60000)),\"end_ms\":$t_end},{\"gpus\":[2,3],\"case\":\"balanced\",\"model\":\"matmul\",\"ready_ms\":$t_ready,\"end_ms\":$t_end}]}"
}

# Two 2-GPU slowed jobs at once: NAME MODEL FACTOR_A FACTOR_B SECONDS
pair_round() {
  local name=$1 model=$2 fa=$3 fb=$4 s=$5
  record_start "$name"
  torchrun_job "${name}a" 0,1 29510 "$model" --rank 1 --factor "$fa" --seconds "$s"
  torchrun_job "${name}b" 2,3 29511 "$model" --rank 1 --factor "$fb" --seconds "$s"
  wait_file "$dir/${name}a.ready" 150; wait_file "$dir/${name}b.ready" 150
  local t_ready; t_ready=$(now)
  eval "wait \$job_${name//-/_}a \$job_${name//-/_}b" 2>/dev/null
  local t_end; t_end=$(now)
  stop_all; record_stop
  truth "$name" "{\"jobs\":[{\"gpus\":[0,1],\"case\":\"slow\",\"model\":\"$model\",\"factor\":$fa,\"slowed_device\":1,\"ready_ms\":$t_ready,\"end_ms\":$t_end},{\"gpus\":[2,3],\"case\":\"slow\",\"model\":\"$model\",\"factor\":$fb,\"slowed_device\":3,\"ready_ms\":$t_ready,\"end_ms\":$t_end}]}"
  say "$name: $model $fa | $fb done"
}
four_round() { # NAME FACTOR SECONDS
  local name=$1 f=$2 s=$3
  record_start "$name"
  torchrun_job "$name" 0,1,2,3 29512 slow --rank 3 --factor "$f" --seconds "$s"
  wait_file "$dir/$name.ready" 150
  local t_ready; t_ready=$(now)
  eval "wait \$job_${name//-/_}" 2>/dev/null
  local t_end; t_end=$(now)
  stop_all; record_stop
  truth "$name" "{\"jobs\":[{\"gpus\":[0,1,2,3],\"case\":\"slow\",\"model\":\"matmul\",\"factor\":$f,\"slowed_device\":3,\"ready_ms\":$t_ready,\"end_ms\":$t_end}]}"
  say "$name: 4 GPUs $f done"
}

sensitivity() {
  pair_round mm2-a slow 1.0 1.05 45
  pair_round mm2-b slow 1.1 1.2 45
  pair_round mm2-c slow 1.3 1.0 45
  four_round mm4-10 1.0 40
  four_round mm4-11 1.1 40
  four_round mm4-12 1.2 40
  pair_round rn2-a resnet 1.0 1.1 45
  pair_round rn2-b resnet 1.2 1.3 45
}

# What each view says about a stall, live, once it has lasted about 45 s: `check --window 30s`,
# `serve`'s /metrics, the terminal UI at 100x30, and `run`'s summary when the job is ended.
views() { # NAME
  local n=$1
  # Both checks watch the same 30 s.
  (timeout 60 "$bin" check --window 30s --json >"$dir/$n.check.json" 2>"$dir/logs/$n.check.err"
   echo "exit $?" >>"$dir/$n.check.json.exit") &
  timeout 60 "$bin" check --window 30s >"$dir/$n.check.txt" 2>&1
  wait $!
  curl -s --max-time 10 http://127.0.0.1:9411/metrics >"$dir/$n.metrics.txt" 2>/dev/null ||
    python3 -c 'import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:9411/metrics", timeout=10).read().decode())' >"$dir/$n.metrics.txt" 2>&1
  if command -v tmux >/dev/null; then
    $ui capture-pane -p -t ui >"$dir/$n.tui.txt"
    $ui send-keys -t ui j; sleep 2
    $ui capture-pane -p -t ui >"$dir/$n.tui-peers.txt"
    $ui send-keys -t ui j; sleep 1
  fi
  say "$n: check exit $(cat "$dir/$n.check.json.exit"); $(grep -m3 '^job verdict' "$dir/$n.check.txt" | cut -c1-220)"
}

live() {
  [ -d .gpu-bundle/tmuxroot ] && export PATH=$PWD/.gpu-bundle/tmuxroot/usr/bin:$PATH \
    LD_LIBRARY_PATH=$PWD/.gpu-bundle/tmuxroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  ui="tmux -L gpudiag-job-stall"
  "$bin" serve --listen 127.0.0.1:9411 >"$dir/logs/serve.log" 2>&1 &
  serve_pid=$!
  if command -v tmux >/dev/null; then
    $ui kill-server 2>/dev/null
    $ui new -d -s ui -x 100 -y 30 "$bin --config /dev/null"
  else
    say "live: no tmux: the UI is not captured"
  fi
  # Round 1: a hang under `gpudiag run` (GPUs 0,1), a rank SIGKILLed with no launcher (2,3).
  record_start live1
  CUDA_VISIBLE_DEVICES=0,1 timeout 400 "$bin" run --json --report-file "$dir/live-hang.run.json" -- \
    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29521 \
    --rdzv-id livehang "$wl/stall.py" hang --rank 1 --after 10 --seconds 600 \
    --ready "$dir/livehang.ready" >"$dir/logs/live-hang.log" 2>"$dir/live-hang.run.stderr" &
  run_pid=$!
  loose_job livekill 2,3 29522 steady --seconds 600
  wait_file "$dir/livehang.ready" 150; wait_file "$dir/livekill.ready" 150
  sleep 10
  local t_fault; t_fault=$(now)
  kill_pid=$(pid_on_gpu 3); kill -KILL "$kill_pid"
  say "live1: rank 1 of the hang job stops calling about now; SIGKILL pid $kill_pid (GPU 3)"
  sleep 30
  ras live1
  sleep 12
  views live1
  # `run` ends with the job: torchrun, asked to stop, tears its workers down.
  pkill -TERM -f 'rdzv-id livehang' 2>/dev/null
  local i=0
  while kill -0 "$run_pid" 2>/dev/null && [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done
  kill -0 "$run_pid" 2>/dev/null && say "live1: gpudiag run did not end within 30 s of SIGTERM"
  stop_all; record_stop
  truth live1 "{\"jobs\":[{\"gpus\":[0,1],\"case\":\"hung\",\"missing_device\":1,\"stall_from_ms\":$t_fault},{\"gpus\":[2,3],\"case\":\"exited\",\"missing_device\":3,\"pid\":$kill_pid,\"stall_from_ms\":$t_fault}]}"
  # Round 2: a rank stopped (0,1); a rank-0 checkpoint of 60 s (2,3), then balanced again.
  record_start live2
  torchrun_job livestop 0,1 29523 steady --seconds 600
  torchrun_job liveckpt 2,3 29524 checkpoint --rank 0 --after 10 --pause 60 --seconds 100
  wait_file "$dir/livestop.ready" 150; wait_file "$dir/liveckpt.ready" 150
  sleep 10
  t_fault=$(now)
  stop_pid=$(pid_on_gpu 1); kill -STOP "$stop_pid"
  say "live2: SIGSTOP pid $stop_pid (GPU 1); rank 0 of the other job checkpoints about now"
  sleep 42
  views live2
  sleep 30
  kill -CONT "$stop_pid"
  stop_all; record_stop
  truth live2 "{\"jobs\":[{\"gpus\":[0,1],\"case\":\"stopped\",\"missing_device\":1,\"pid\":$stop_pid,\"stall_from_ms\":$t_fault},{\"gpus\":[2,3],\"case\":\"checkpoint\",\"missing_device\":2,\"stall_from_ms\":$t_fault,\"stall_to_ms\":$((t_fault + 60000))}]}"
  command -v tmux >/dev/null && $ui kill-server 2>/dev/null
  kill "$serve_pid" 2>/dev/null
  grep -h '^gpudiag:' "$dir/live-hang.run.stderr" | head -12 >>"$dir/summary.txt"
}

# The hang of round 1 alone, on two GPUs: `run`, `check`, `serve` and the UI while it lasts.
live_hang() {
  [ -d .gpu-bundle/tmuxroot ] && export PATH=$PWD/.gpu-bundle/tmuxroot/usr/bin:$PATH \
    LD_LIBRARY_PATH=$PWD/.gpu-bundle/tmuxroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  ui="tmux -L gpudiag-job-stall"
  "$bin" serve --listen 127.0.0.1:9411 >"$dir/logs/serve.log" 2>&1 &
  serve_pid=$!
  command -v tmux >/dev/null && { $ui kill-server 2>/dev/null; $ui new -d -s ui -x 100 -y 30 "$bin --config /dev/null"; }
  record_start livehang
  CUDA_VISIBLE_DEVICES=0,1 timeout 400 "$bin" run --report-file "$dir/live-hang.run.json" -- \
    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29521 \
    --rdzv-id livehang "$wl/stall.py" hang --rank 1 --after 8 --seconds 600 \
    --ready "$dir/livehang.ready" >"$dir/logs/live-hang.log" 2>"$dir/live-hang.run.stderr" &
  run_pid=$!
  wait_file "$dir/livehang.ready" 120 || say "live-hang: never ready"
  sleep 8
  local t_fault; t_fault=$(now)
  say "live-hang: rank 1 stops calling the all-reduce about now"
  sleep 38
  views livehang
  pkill -TERM -f 'rdzv-id livehang' 2>/dev/null
  local i=0
  while kill -0 "$run_pid" 2>/dev/null && [ $i -lt 40 ]; do sleep 0.5; i=$((i + 1)); done
  stop_all; record_stop
  command -v tmux >/dev/null && $ui kill-server 2>/dev/null
  kill "$serve_pid" 2>/dev/null
  truth livehang "{\"jobs\":[{\"gpus\":[0,1],\"case\":\"hung\",\"missing_device\":1,\"stall_from_ms\":$t_fault}]}"
  grep -h '^gpudiag:' "$dir/live-hang.run.stderr" | cut -c1-400 | head -8 >>"$dir/summary.txt"
  grep -h 'gpudiag_job_verdict\|gpudiag_job_stuck\|gpudiag_job_missing\|gpudiag_job_gpu_role' "$dir/livehang.metrics.txt" | grep -v '^#' | head -12 >>"$dir/summary.txt"
  head -12 "$dir/livehang.tui.txt" >>"$dir/summary.txt" 2>/dev/null
}

case $part in
  scenarios) scenarios ;;
  sensitivity) sensitivity ;;
  live) live ;;
  live-hang) live_hang ;;
  *) echo "job_stall: scenarios, sensitivity or live" >&2; exit 2 ;;
esac
for f in "$dir"/logs/*.log; do tail -3 "$f" | sed "s|^|$(basename "$f"): |" >>"$dir/summary.txt"; done
tar -C "$work" -czf "$out/job_stall-$part.tar.gz" job_stall
cat "$dir/summary.txt"
ls -la "$dir" "$dir/ras" | head -60
