#!/usr/bin/env bash
# `gpudiag fleet` against a Prometheus holding a 2,048-GPU fleet: 256 nodes of 8 GPUs over the
# last hour at a 15 s scrape interval, made by benches/fleet/make_openmetrics.py from real
# expositions and backfilled with promtool. Needs prometheus, promtool, tmux, curl and python3.
#
#   benches/fleet_scale.sh [GPUDIAG_BINARY] [NODES] [MINUTES]
#
# GPUDIAG_BINARY defaults to $GPUDIAG_BIN, else target/release/gpudiag; NODES to $NODES, else 256;
# MINUTES to $MINUTES, else 60. SAMPLE_S (120) is how long the terminal UI is watched,
# KEEP=1 leaves the work directory (OpenMetrics file, TSDB, outputs) in place, REUSE=DIR
# measures again on the TSDB such a directory holds (no generation nor backfill), and
# SKIP_FLEET=1 measures only the Prometheus side (generation, backfill, reference queries with
# curl), for a binary without `fleet`.
#
# 1. Generate and backfill into a temporary directory; start Prometheus on loopback on that
#    TSDB (no scrape targets; 30 d retention so the blocks stay).
# 2. Time reference instant queries with curl at END, the data's last scrape.
# 3. Run `gpudiag fleet --prometheus URL --at END --json` 5 times: wall time, exit code, output
#    size, and the report's own counts and query figures when it has them.
# 4. Start `gpudiag fleet --prometheus URL --at END --interval 15s` in a detached 200x60 tmux
#    session: time until it shows "<NODES*8> GPUs", then its CPU and memory over SAMPLE_S.
# Prometheus's CPU time and query-duration counters are read around steps 3 and 4. Prints a
# Markdown table; everything it started is stopped on exit.
set -euo pipefail

bin=${1:-${GPUDIAG_BIN:-target/release/gpudiag}}
nodes=${2:-${NODES:-256}}
minutes=${3:-${MINUTES:-60}}
sample_s=${SAMPLE_S:-120}
step=15
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
  echo "fleet_scale.sh: $*" >&2
  exit 2
}

for tool in prometheus promtool tmux curl python3; do
  command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install prometheus tmux curl python3)"
done
if [[ ${SKIP_FLEET:-0} != 1 ]]; then
  [[ -x $bin ]] || die "no gpudiag binary at $bin (cargo build --release, or pass its path)"
  "$bin" fleet --help >/dev/null 2>&1 ||
    die "$bin has no \`fleet\` subcommand (build one that has it, or SKIP_FLEET=1 for the Prometheus side only)"
  bin=$(realpath "$bin")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gpudiag-fleet-scale.XXXXXX")
tmux_sock="gpudiag-fleet-scale-$$"
prom_pid=""
cleanup() {
  tmux -L "$tmux_sock" kill-server 2>/dev/null || true
  if [[ -n $prom_pid ]]; then
    kill "$prom_pid" 2>/dev/null || true
    wait "$prom_pid" 2>/dev/null || true
  fi
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "kept $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

now() { echo "$EPOCHREALTIME"; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$(now)"; }
hz=$(getconf CLK_TCK)
# utime + stime of a process, in seconds. The command name is the 2nd field and may hold
# spaces, so fields are counted after its closing parenthesis.
cpu_s() {
  python3 -c "import sys; f = open(f'/proc/{sys.argv[1]}/stat').read().rsplit(')', 1)[1].split(); \
print((int(f[11]) + int(f[12])) / int(sys.argv[2]))" "$1" "$hz"
}
kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }

# --- 1. The fleet's history, backfilled --------------------------------------------------------
if [[ -n ${REUSE:-} ]]; then
  # A work directory a KEEP=1 run left: its TSDB and the END it was made for.
  [[ -d $REUSE/data && -f $REUSE/end ]] || die "REUSE=$REUSE is not a directory a KEEP=1 run left"
  data=$(realpath "$REUSE/data")
  end=$(cat "$REUSE/end")
  gen_s="(reused)" backfill_s="(reused)" om_mb="?"
  cp "$REUSE/generate.log" "$work/generate.log" 2>/dev/null || true
else
  # The data ends a minute ago, on a scrape: backfilled blocks then never reach into the head
  # block of the Prometheus that opens them, and every query names its time.
  end=$(($(date +%s) / step * step - 60))
  om="$work/fleet.om"
  # About 90 kB a node-minute (230 bytes a sample: each line spells out all its labels).
  need_mb=$((nodes * minutes * 90 / 1000 + 200))
  free_mb=$(df -Pm "$work" | awk 'NR == 2 { print $4 }')
  ((free_mb > need_mb)) || die "the OpenMetrics file needs about $need_mb MB and $work has $free_mb MB free"
  t0=$(now)
  python3 "$here/fleet/make_openmetrics.py" "$om" --nodes "$nodes" --minutes "$minutes" \
    --step "$step" --end "$end" 2>"$work/generate.log" ||
    die "could not write $om: $(tail -1 "$work/generate.log")"
  gen_s=$(since "$t0")
  om_mb=$(($(stat -c %s "$om") / 1000000))
  t0=$(now)
  promtool tsdb create-blocks-from openmetrics "$om" "$work/data" >"$work/backfill.log" 2>&1 ||
    die "promtool could not backfill $om: $(tail -1 "$work/backfill.log")"
  backfill_s=$(since "$t0")
  [[ ${KEEP:-0} == 1 ]] || rm -f "$om"
  data="$work/data"
  echo "$end" >"$work/end"
fi
tsdb_mb=$(du -sm "$data" | cut -f1)

port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
addr="127.0.0.1:$port"
printf 'global:\n  scrape_interval: 15s\n' >"$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$data" \
  --storage.tsdb.retention.time=30d --web.listen-address="$addr" --log.level=warn \
  >"$work/prometheus.log" 2>&1 &
prom_pid=$!
t0=$(now)
until curl -fs "http://$addr/-/ready" >/dev/null 2>&1; do
  kill -0 "$prom_pid" 2>/dev/null || die "prometheus exited: $(tail -1 "$work/prometheus.log")"
  [[ $(since "$t0" | cut -d. -f1) -lt 120 ]] || die "prometheus not ready after 120 s"
  sleep 0.2
done
prom_ready_s=$(since "$t0")

# The value of an instant query at END, and how long curl waited for it.
query() {
  curl -fsG "http://$addr/api/v1/query" --data-urlencode "query=$1" --data-urlencode "time=$end" \
    -o "$work/q.json" -w '%{time_total}\n' >"$work/q.time" || die "query failed: $1"
  python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['data']['result']; \
print(r[0]['value'][1] if len(r) == 1 and 'value' in r[0] else f'{len(r)} series')" "$work/q.json"
}
gpus=$(query 'count(DCGM_FI_DEV_GPU_UTIL)')
[[ $gpus == $((nodes * 8)) ]] || die "Prometheus holds $gpus GPUs at $end, not $((nodes * 8))"

# Prometheus's own query figures: engine inner-eval seconds, and query API seconds and calls.
prom_stats() {
  curl -fs "http://$addr/metrics" | python3 -c "
import re, sys
engine = api = calls = 0.0
for line in sys.stdin:
    if line.startswith('prometheus_engine_query_duration_seconds_sum{slice=\"inner_eval\"}'):
        engine += float(line.split()[-1])
    m = re.match(r'prometheus_http_request_duration_seconds_(sum|count)\{handler=\"/api/v1/query[^\"]*\"', line)
    if m:
        if m.group(1) == 'sum':
            api += float(line.split()[-1])
        else:
            calls += float(line.split()[-1])
print(engine, api, int(calls))"
}
delta() { python3 -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); \
print(' '.join(f'{float(y) - float(x):.3f}' for x, y in zip(a, b)))" "$1" "$2"; }

rows=()
row() { rows+=("| $1 | $2 |"); }
row "nodes x GPUs" "$nodes x 8 = $gpus GPUs at END ($(date -u -d "@$end" +%FT%TZ))"
row "history" "$minutes min at ${step} s"
row "OpenMetrics file" "$om_mb MB ($(grep -o '[0-9]* series, [0-9]* samples' "$work/generate.log"))"
row "generation" "$gen_s s"
row "backfill (promtool)" "$backfill_s s"
row "TSDB on disk" "$tsdb_mb MB"
row "Prometheus ready" "$prom_ready_s s after start"

# --- 2. Reference queries with curl ------------------------------------------------------------
for q in 'count(DCGM_FI_DEV_GPU_UTIL)' 'count(up)' 'count(up == 0)' \
  'count(count by (Hostname) (DCGM_FI_DEV_GPU_UTIL))' \
  '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_SM_ACTIVE|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_POWER_USAGE"}' \
  'gpudiag_verdict' 'gpudiag_finding' 'gpudiag_gpu_job_info' \
  'max_over_time(DCGM_FI_PROF_SM_ACTIVE[5m])'; do
  v=$(query "$q")
  row "curl \`${q//|/\\|}\`" "$(cat "$work/q.time") s ($v)"
done

if [[ ${SKIP_FLEET:-0} == 1 ]]; then
  printf '| figure | value |\n|---|---|\n'
  printf '%s\n' "${rows[@]}"
  exit 0
fi

# --- 3. One-shot JSON --------------------------------------------------------------------------
url="http://$addr"
p0=$(prom_stats)
c0=$(cpu_s "$prom_pid")
for i in 1 2 3 4 5; do
  t0=$(now)
  rc=0
  "$bin" fleet --prometheus "$url" --at "$end" --json >"$work/fleet-$i.json" 2>"$work/fleet-$i.err" || rc=$?
  wall=$(since "$t0")
  size=$(stat -c %s "$work/fleet-$i.json")
  said=$(python3 -c "
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f'not JSON ({type(e).__name__})'); sys.exit()
c, q = r.get('counts') or {}, r.get('queries') or {}
secs = q.get('seconds')
secs = f'{secs:.3f}' if isinstance(secs, (int, float)) else '?'
print(f\"nodes {c.get('nodes', '?')}, gpus {c.get('gpus', '?')}; queries {q.get('count', '?')}, \"
      f\"{secs} s, {q.get('bytes', '?')} bytes\")" "$work/fleet-$i.json")
  [[ ! -s $work/fleet-$i.err ]] || said="$said; stderr: $(head -c 200 "$work/fleet-$i.err" | tr '\n' ' ')"
  row "fleet --json run $i" "$wall s, exit $rc, $size bytes; $said"
done
p1=$(prom_stats)
c1=$(cpu_s "$prom_pid")
read -r engine api calls <<<"$(delta "$p0" "$p1")"
row "Prometheus during the 5 JSON runs" "CPU $(delta "$c0" "$c1") s; ${calls%.*} query and query_range calls, $api s in them, $engine s inner eval"

# --- 4. The terminal UI ------------------------------------------------------------------------
want="$((nodes * 8)) GPUs"
p0=$(prom_stats)
c0=$(cpu_s "$prom_pid")
# The pane stays after gpudiag exits, so that an early exit is read, not raced.
tmux -L "$tmux_sock" new-session -d -s fleet -x 200 -y 60 "sleep 600"
tmux -L "$tmux_sock" set-option -t fleet remain-on-exit on >/dev/null
t0=$(now)
tmux -L "$tmux_sock" respawn-pane -k -t fleet \
  "exec '$bin' fleet --prometheus '$url' --at '$end' --interval 15s 2>'$work/tui.err'"
ui_pid=$(tmux -L "$tmux_sock" list-panes -t fleet -F '#{pane_pid}')
# Whether gpudiag still runs: tmux marks the pane dead when it exits, and may leave it a zombie
# for a while, which kill -0 would count as running.
alive() {
  [[ $(tmux -L "$tmux_sock" display-message -p -t fleet '#{pane_dead}' 2>/dev/null) == 0 ]] &&
    [[ $(awk '{ print $3 }' "/proc/$ui_pid/stat" 2>/dev/null) != Z ]]
}
shown=""
while [[ $(since "$t0" | cut -d. -f1) -lt 30 ]]; do
  if tmux -L "$tmux_sock" capture-pane -p -t fleet 2>/dev/null | grep -qF "$want"; then
    shown=$(since "$t0")
    break
  fi
  alive || break
  sleep 0.05
done
tmux -L "$tmux_sock" capture-pane -p -t fleet >"$work/tui-first.txt" 2>/dev/null || true
if [[ -z $shown ]]; then
  alive && shown="not shown within 30 s" || shown="gpudiag exited first"
else
  shown="$shown s"
fi
row "TUI: launch to \"$want\"" "$shown"
if alive; then
  u0=$(cpu_s "$ui_pid")
  uc0=$(cpu_s "$prom_pid")
  s0=$(now)
  peak_rss=0
  end_at=$(($(date +%s) + sample_s))
  while [[ $(date +%s) -lt $end_at ]] && alive; do
    rss=$(kib "$ui_pid" VmRSS || true)
    rss=${rss:-0}
    ((rss > peak_rss)) && peak_rss=$rss
    sleep 1
  done
  if alive; then
    hwm=$(kib "$ui_pid" VmHWM)
    span=$(since "$s0")
    ui_cpu=$(delta "$u0" "$(cpu_s "$ui_pid")")
    prom_cpu=$(delta "$uc0" "$(cpu_s "$prom_pid")")
    pct=$(python3 -c "import sys; print(f'{100 * float(sys.argv[1]) / float(sys.argv[2]):.1f}')" "$ui_cpu" "$span")
    row "TUI over $span s ($((sample_s / 15)) refreshes at 15 s)" "gpudiag CPU $ui_cpu s = $pct% of one core; RSS peak $((peak_rss / 1024)) MiB sampled, VmHWM $((hwm / 1024)) MiB"
    row "Prometheus over the same span" "CPU $prom_cpu s"
  else
    row "TUI" "gpudiag exited during the sampling: $(head -c 200 "$work/tui.err" | tr '\n' ' ')"
  fi
else
  row "TUI" "gpudiag exited: $(head -c 200 "$work/tui.err" | tr '\n' ' ')"
fi
tmux -L "$tmux_sock" capture-pane -p -t fleet >"$work/tui-last.txt" 2>/dev/null || true
p1=$(prom_stats)
c1=$(cpu_s "$prom_pid")
read -r engine api calls <<<"$(delta "$p0" "$p1")"
row "Prometheus during the TUI" "CPU $(delta "$c0" "$c1") s; ${calls%.*} query and query_range calls, $api s in them, $engine s inner eval"

printf '| figure | value |\n|---|---|\n'
printf '%s\n' "${rows[@]}"
