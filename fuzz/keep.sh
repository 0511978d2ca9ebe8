#!/usr/bin/env bash
# Keeps a fuzz crash as a regression fixture: fuzz/keep.sh TARGET ARTIFACT [NAME]
# Writes the file a user would hand gpudiag (the target's encoding undone) to
# tests/fixtures/fuzz/TARGET/, where tests/fuzz_regressions.rs runs it through the real binary.
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/keep.sh TARGET ARTIFACT [NAME]}
artifact=${2:?usage: fuzz/keep.sh TARGET ARTIFACT [NAME]}
name=${3:-$(basename "$artifact")}
out=../tests/fixtures/fuzz/$target
mkdir -p "$out"
case $target in
  # First byte: odd means the rest is gzip-compressed by the target.
  recording)
    if (( $(od -An -tu1 -N1 "$artifact") % 2 == 1 )); then
      tail -c +2 "$artifact" | gzip -n > "$out/$name.ndjson.gz"
    else
      tail -c +2 "$artifact" > "$out/$name.ndjson"
    fi ;;
  bundle) gzip -n < "$artifact" > "$out/$name.tar.gz" ;;
  # Each input is read as TOML text and as (key, value) pairs set on the default config; keep
  # both readings (the second as the TOML it made, which the target prints on request).
  config)
    if iconv -f UTF-8 -t UTF-8 "$artifact" >/dev/null 2>&1; then
      cp "$artifact" "$out/$name.toml"
    fi
    bin=target/x86_64-unknown-linux-gnu/release/config
    [ -x "$bin" ] || cargo +nightly fuzz build config
    GPUDIAG_FUZZ_SHOW_CONFIG=1 "$bin" "$artifact" 2>&1 \
      | sed -n '/^--- structured config ---$/,/^--- end ---$/p' | sed '1d;$d' \
      > "$out/$name-structured.toml"
    [ -s "$out/$name-structured.toml" ] || rm "$out/$name-structured.toml" ;;
  # First byte: how the target split the reads; the request is the rest.
  http_request) tail -c +2 "$artifact" > "$out/$name.http" ;;
  kernel_log) cp "$artifact" "$out/$name.kmsg" ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac
ls -l "$out"
