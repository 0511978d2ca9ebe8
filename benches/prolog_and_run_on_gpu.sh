#!/usr/bin/env bash
# The GPU-host half of the prolog-memory and `run` checks, in one call from the repository root:
#   BASE=.gpu-bundle-base/gpudiag benches/prolog_and_run_on_gpu.sh
# 1. `check --probes quick` peak RSS and wall on 1, 2, 4 (8) GPUs (benches/prolog_rss.py), the
#    binary before (BASE, when present) and after, after one warm-up each so that both find the
#    driver's JIT cache filled; with the bare-driver floor.
# 2. `run` on a trainer beside an idle process holding 20 GiB: per-process SM and CPU shares.
# 3. SIGHUP sent to `gpudiag run` reaches a real trainer, whose exit code comes back.
# 4. The TUI 15 s into a one-warp spin that follows idle time (tmux capture).
# Everything lands in $OUT/r and $OUT/r.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/gpudiag-out}
R=$OUT/r
mkdir -p "$R"
NEW=$PWD/.gpu-bundle/gpudiag
BASE=${BASE:-}
n=$(nvidia-smi -L | wc -l)
gpus=1
[ "$n" -ge 2 ] && gpus=1,2
[ "$n" -ge 4 ] && gpus=1,2,4
[ "$n" -ge 8 ] && gpus=1,2,4,8
nvidia-smi -L > "$R/gpus.txt"
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >> "$R/gpus.txt"
# The Slurm scripts map /dev/nvidiaN numbers to UUIDs through this file: keep its real layout.
for f in /proc/driver/nvidia/gpus/*/information; do echo "== $f"; cat "$f"; done > "$R/proc_driver_nvidia.txt" 2>&1

for bin in ${BASE:+"$BASE"} "$NEW"; do
  "$bin" check --probes quick --json --device 0 > /dev/null 2>&1
done
if [ -n "$BASE" ] && [ -x "$BASE" ]; then
  python3 benches/prolog_rss.py --bin "$BASE" --label base- --gpus "$gpus" --runs 2 --no-floor \
    --keep-reports "$R/reports" --json-out "$R/base.json" > "$R/base.md" 2>&1
fi
python3 benches/prolog_rss.py --bin "$NEW" --label new- --gpus "$gpus" --runs 2 \
  --keep-reports "$R/reports" --json-out "$R/new.json" > "$R/new.md" 2>&1

(cd benches/workloads && "$NEW" run --report-file "$R/trainer.json" --interval 500ms \
  -- python3 trainer_beside_idle.py 20 2> "$R/trainer.txt"; echo "run exit $?" >> "$R/trainer.txt")

python3 - "$NEW" > "$R/sighup.txt" 2>&1 <<'PY'
import os, signal, subprocess, sys, time
mark = "/tmp/gpudiag-hup"
if os.path.exists(mark):
    os.remove(mark)
trainer = f"""
import signal, sys, time, torch
x = torch.randn(4096, 4096, device='cuda')
def on_hup(s, f):
    open({mark!r}, 'w').write('HUP')
    sys.exit(42)
signal.signal(signal.SIGHUP, on_hup)
t = time.time()
while time.time() - t < 60:
    x @ x
    torch.cuda.synchronize()
"""
p = subprocess.Popen([sys.argv[1], "run", "--interval", "500ms", "--", "python3", "-c", trainer],
                     stderr=subprocess.PIPE)
time.sleep(10)
p.send_signal(signal.SIGHUP)
_, err = p.communicate(timeout=60)
got = open(mark).read() if os.path.exists(mark) else None
print(f"gpudiag exit {p.returncode} (the trainer exits 42 on SIGHUP); trainer got: {got}")
print(err.decode(errors="replace")[-2000:])
PY

TMUX_BIN=tmux
if ! command -v tmux > /dev/null && [ -x .gpu-bundle/tmuxroot/usr/bin/tmux ]; then
  export PATH="$PWD/.gpu-bundle/tmuxroot/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$PWD/.gpu-bundle/tmuxroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export TERM=${TERM:-xterm-256color}
$TMUX_BIN new-session -d -s spin -x 120 -y 36 "$NEW --interval 500ms" \
  && sleep 22 \
  && (python3 -c "
import time, torch
t = time.time()
while time.time() - t < 19:
    torch.cuda._sleep(50_000_000)
    torch.cuda.synchronize()
" &) \
  && sleep 15 \
  && $TMUX_BIN capture-pane -p -t spin > "$R/tui_spin_120x36.txt" \
  && $TMUX_BIN resize-window -t spin -x 80 -y 24 2> /dev/null; sleep 2; \
  $TMUX_BIN capture-pane -p -t spin > "$R/tui_spin_80x24.txt"; \
  $TMUX_BIN send-keys -t spin q; sleep 1; $TMUX_BIN kill-server 2> /dev/null
wait
tar czf "$OUT/r.tgz" -C "$OUT" r
cat "$R/base.md" "$R/new.md" 2> /dev/null
