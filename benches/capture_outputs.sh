#!/usr/bin/env bash
# Captures what gpudiag prints for the demo and every recording fixture (check text and JSON,
# trace, serve's /metrics once the replay has played out, report members), with the fields that
# differ from run to run (wall-clock times, host names, archive dates, ports) masked, so two
# builds can be compared with `diff -r`:
#
#   benches/capture_outputs.sh target/debug/gpudiag /tmp/before
#   (change the code, rebuild)
#   benches/capture_outputs.sh target/debug/gpudiag /tmp/after
#   diff -r /tmp/before /tmp/after
set -uo pipefail
bin=$(realpath "$1")
out=$2
mkdir -p "$out"
cd "$(dirname "$0")/.."

# Masks values that change between runs: creation and generation times, durations of the
# run itself, the host's name, and the serve port.
mask() {
  sed -E \
    -e 's/"(generated_ms|created_ms|captured_ms|written_ms|elapsed_ms|wall_ms)": ?[0-9.]+/"\1":"<t>"/g' \
    -e 's/"(host|hostname|Hostname)": ?"[^"]*"/"\1":"<host>"/g' \
    -e "s/Hostname=\"[^\"]*\"/Hostname=\"<host>\"/g" \
    -e 's/gpudiag_uptime_seconds [0-9.e+-]+/gpudiag_uptime_seconds <t>/' \
    -e 's/(seconds_since_last_sample\{[^}]*\}) [0-9.e+-]+/\1 <t>/' \
    -e 's/(sample_age_seconds\{[^}]*\}) [0-9.e+-]+/\1 <t>/' \
    -e "s#$out#<out>#g"
}

sources=("--demo")
for f in tests/fixtures/recordings/*.ndjson; do sources+=("--replay $f"); done

for src in "${sources[@]}"; do
  name=$(basename "${src#--replay }" .ndjson)
  [ "$src" = "--demo" ] && name=demo
  d="$out/$name"
  mkdir -p "$d"
  # shellcheck disable=SC2086
  "$bin" check $src --json >"$d/check.json" 2>"$d/check.json.stderr"; echo "exit $?" >>"$d/check.json.stderr"
  # shellcheck disable=SC2086
  "$bin" check $src >"$d/check.txt" 2>"$d/check.txt.stderr"; echo "exit $?" >>"$d/check.txt.stderr"
  # shellcheck disable=SC2086
  "$bin" trace $src -o "$d/trace.json" --force >/dev/null 2>"$d/trace.stderr"; echo "exit $?" >>"$d/trace.stderr"
  # shellcheck disable=SC2086
  "$bin" report $src -o "$d/report.tar.gz" --force >/dev/null 2>"$d/report.stderr"; echo "exit $?" >>"$d/report.stderr"
  if [ -f "$d/report.tar.gz" ]; then
    mkdir -p "$d/report"
    tar -xzf "$d/report.tar.gz" -C "$d/report"
    rm "$d/report.tar.gz"
    for m in "$d"/report/*.gz; do [ -f "$m" ] && gunzip -f "$m"; done
  fi
  if [ "$name" != demo ]; then
    # shellcheck disable=SC2086
    "$bin" serve $src --listen 127.0.0.1:0 >"$d/serve.stdout" 2>"$d/serve.stderr" &
    pid=$!
    addr=""
    for _ in $(seq 100); do
      addr=$(grep -oE '127\.0\.0\.1:[0-9]+' "$d/serve.stderr" | head -1)
      [ -n "$addr" ] && break
      sleep 0.1
    done
    for _ in $(seq 200); do
      body=$(curl -s "http://$addr/metrics")
      echo "$body" | grep -q '^gpudiag_source_ended 1' && break
      sleep 0.1
    done
    echo "$body" | grep -v '^# ' | sort >"$d/metrics.txt"
    echo "$body" | grep '^# ' >"$d/metrics.help"
    kill -INT $pid; wait $pid 2>/dev/null
    sed -i -E 's/127\.0\.0\.1:[0-9]+/127.0.0.1:<port>/' "$d/serve.stderr"
  fi
  for f in $(find "$d" -type f); do mask <"$f" >"$f.m" && mv "$f.m" "$f"; done
done
echo "captured into $out"
