#!/usr/bin/env bash
# A/B of the CPU benchmarks (rules, history, the TUI frame) between a base commit and the
# working tree, built alike and run interleaved, with the medians side by side:
#
#   benches/ab.sh BASE_COMMIT [ROUNDS]        (ROUNDS defaults to 5)
#
# Both sides build with LTO off and 16 codegen units (a fat-LTO build of each takes most of an
# hour on two cores); what is compared is the code, not the build profile. The TUI frame bench
# replays the demo compiled into the binary, so the base is built with this tree's demo: both
# sides judge the same data. Rounds alternate which side runs first.
set -euo pipefail
base=${1:?usage: benches/ab.sh BASE_COMMIT [ROUNDS]}
rounds=${2:-5}
top=$(git rev-parse --show-toplevel)
cd "$top"
benches=(rules history tui_frame)
export CARGO_PROFILE_BENCH_LTO=false CARGO_PROFILE_BENCH_CODEGEN_UNITS=16
export CARGO_TARGET_DIR="$top/target/ab"
wt="$top/target/ab-base"
git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
git worktree add --quiet --detach "$wt" "$base"
trap 'git worktree remove --force "$wt" 2>/dev/null || true' EXIT
cp assets/demo/demo.ndjson.gz "$wt/assets/demo/demo.ndjson.gz"
out="$CARGO_TARGET_DIR/out"
rm -rf "$out" "$CARGO_TARGET_DIR/bin"
mkdir -p "$out" "$CARGO_TARGET_DIR/bin/base" "$CARGO_TARGET_DIR/bin/new"
build() {
  local dir=$1 side=$2
  # The binary too, in the same profile, for comparing what each side concludes
  # (benches/findings_ab.py).
  (cd "$dir" && cargo build --locked --profile bench --bin gpudiag \
    && cp "$CARGO_TARGET_DIR/release/gpudiag" "$CARGO_TARGET_DIR/bin/$side/gpudiag")
  (cd "$dir" && cargo bench --locked --no-run "${benches[@]/#/--bench=}" --message-format=json) \
    | python3 -c '
import json, shutil, sys
dest = sys.argv[1]
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and "bench" in m["target"]["kind"] and m.get("executable"):
        name = m["target"]["name"]
        shutil.copy2(m["executable"], f"{dest}/{name}")
' "$CARGO_TARGET_DIR/bin/$side"
}
build "$wt" base
build "$top" new
for round in $(seq "$rounds"); do
  if [ $((round % 2)) = 1 ]; then order=(base new); else order=(new base); fi
  for bench in "${benches[@]}"; do
    for side in "${order[@]}"; do
      (cd "$top" && "$CARGO_TARGET_DIR/bin/$side/$bench") > "$out/$side.$bench.$round.txt" 2>&1
    done
  done
done
python3 "$top/benches/ab_summary.py" "$out"
