#!/usr/bin/env bash
# Records assets/demo/demo.ndjson.gz on a GPU host: assets/demo/load.py under `gpudiag record`.
#
#   assets/demo/record.sh GPUDIAG_BINARY OUTPUT.ndjson.gz
#
# The load runs as a Slurm job would see it (SLURM_JOB_ID and SLURM_JOB_USER in its
# environment), so the demo shows the job column; the recording host has no Slurm of its own.
# The load itself runs as whoever runs this (root on the GPU hosts used so far): every view names
# a process by its job's user, `demo` where USER is unset, so the demo still shows one user.
# The demo is compiled into the binary: keep it under 400 KB (250 ms over about two minutes of
# one GPU is about a tenth of that).
set -euo pipefail
bin=${1:?usage: record.sh GPUDIAG_BINARY OUTPUT.ndjson.gz}
out=${2:?usage: record.sh GPUDIAG_BINARY OUTPUT.ndjson.gz}
here=$(cd "$(dirname "$0")" && pwd)
ready=$(mktemp -u)
SLURM_JOB_ID=4242 SLURM_JOB_USER=${USER:-demo} python3 "$here/load.py" "$ready" &
load=$!
for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.1; done
[ -e "$ready" ] || { echo "the load did not start" >&2; kill "$load"; exit 1; }
"$bin" record --output "$out" --force --interval 250ms --duration 125s
wait "$load"
rm -f "$ready"
ls -l "$out"
