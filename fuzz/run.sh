#!/usr/bin/env bash
# Runs one fuzz target for a while: fuzz/run.sh TARGET [SECONDS] [extra libFuzzer flags...]
# Targets: recording bundle config http_request kernel_log profiler_trace. Needs nightly and cargo-fuzz
# (`cargo install cargo-fuzz --locked`). One process, so it shares a small machine.
# Seeds the corpus from tests/fixtures first (generated seeds are not committed; the seed-*
# files are). A crash lands in fuzz/artifacts/TARGET/: copy it to
# tests/fixtures/fuzz/TARGET/ so tests/fuzz_regressions.rs keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/run.sh TARGET [SECONDS] [libFuzzer flags...]}
seconds=${2:-180}
shift $(( $# >= 2 ? 2 : 1 ))
fixtures=../tests/fixtures
corpus=corpus/$target
mkdir -p "$corpus"
extra=()

case $target in
  recording)
    # The first byte picks plain (even) or gzip (odd).
    for f in "$fixtures"/recordings/*.ndjson "$fixtures"/hostile/*; do
      n=$(basename "$f")
      { printf '\x00'; cat "$f"; } > "$corpus/fixture-plain-$n"
      { printf '\x01'; cat "$f"; } > "$corpus/fixture-gzip-$n"
    done
    # JSON tokens, extreme numbers and every name in the recording schema.
    extra=(-dict=recording.dict)
    max_len=32768 ;;
  bundle)
    # Tar archives (the target gzips them) holding a fixture as the bundle's recording.
    python3 - "$fixtures" "$corpus" <<'PY'
import gzip, io, sys, tarfile, pathlib
fixtures, corpus = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for f in ["recordings/sparse.ndjson", "recordings/all_kinds.ndjson", "hostile/header_only.ndjson"]:
    raw = (fixtures / f).read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in [("README.txt", b"gpudiag bug-report bundle\n"),
                           ("recording.ndjson.gz", gzip.compress(raw, mtime=0)),
                           ("environment.json", b"{}\n")]:
            info = tarfile.TarInfo(name); info.size = len(data); info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    (corpus / ("fixture-" + pathlib.Path(f).stem + ".tar")).write_bytes(buf.getvalue())
PY
    extra=(-dict=recording.dict)
    max_len=65536 ;;
  config)
    cargo run --quiet --locked --manifest-path ../Cargo.toml -- config --default \
      > "$corpus/fixture-default.toml"
    # TOML tokens, special floats and every key name.
    extra=(-dict=config.dict)
    max_len=8192 ;;
  http_request)
    max_len=20000 ;;
  kernel_log)
    for f in "$fixtures"/kmsg/*.kmsg; do cp "$f" "$corpus/fixture-$(basename "$f")"; done
    max_len=65536 ;;
  profiler_trace)
    # Profiler traces cut to their first events (plain: the first byte is even), both key orders.
    python3 - "$fixtures" "$corpus" <<'PY'
import gzip, json, sys, pathlib
fixtures, corpus = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for f in ["profiler/synthetic.pt.trace.json.gz", "profiler/synthetic_base_last.pt.trace.json.gz",
          "profiler/h200_torch2.11/training_with_pause.pt.trace.json.gz"]:
    t = json.loads(gzip.decompress((fixtures / f).read_bytes()))
    t["traceEvents"] = t["traceEvents"][:40]
    (corpus / ("fixture-" + pathlib.Path(f).name.split(".")[0] + ".json")).write_bytes(
        b"\x00" + json.dumps(t).encode())
PY
    extra=(-dict=recording.dict)
    max_len=65536 ;;
  *) echo "unknown target $target (recording bundle config http_request kernel_log profiler_trace)" >&2; exit 2 ;;
esac

# -rss_limit_mb: a parser that allocates gigabytes on a small input is a bug too.
exec cargo +nightly fuzz run "$target" "$corpus" -- \
  -max_total_time="$seconds" -max_len="$max_len" \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" "$@"
