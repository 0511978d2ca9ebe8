# Shared by the gpudiag Slurm prolog and epilog (sourced, not run). SPDX-License-Identifier: MIT OR Apache-2.0
#
# Kept in one file so that the prolog and the epilog map the job's GPUs the same way: a GPU
# the prolog checked is the GPU the epilog summarises.

# Site overrides: a shell fragment setting any GPUDIAG_* variable documented in the scripts.
if [ -r "${GPUDIAG_SLURM_CONF:-/etc/gpudiag/slurm.conf}" ]; then
  # shellcheck source=/dev/null
  . "${GPUDIAG_SLURM_CONF:-/etc/gpudiag/slurm.conf}"
fi

: "${GPUDIAG_BIN:=gpudiag}"
: "${GPUDIAG_GPU_IDS:=minor}"
: "${GPUDIAG_PROC_GPUS:=/proc/driver/nvidia/gpus}"
: "${GPUDIAG_TIMEOUT:=300}"
: "${GPUDIAG_SYSLOG:=1}"
: "${GPUDIAG_STATE_DIR:=/run/gpudiag-slurm}"

# Slurm keeps a prolog's output nowhere useful: say it on stderr (slurmd's log) and in syslog.
gpudiag_log() {
  echo "${GPUDIAG_TAG:-gpudiag}: $*" >&2
  if [ "$GPUDIAG_SYSLOG" = 1 ] && command -v logger >/dev/null 2>&1; then
    logger -t "${GPUDIAG_TAG:-gpudiag}" -- "$*" || true
  fi
}

gpudiag_die_config() {
  gpudiag_log "configuration error: $*"
  exit 2
}

# The node's name as slurmctld knows it; slurmd sets SLURMD_NODENAME, `hostname -s` is the
# usual fallback where the node name and the host name agree.
gpudiag_nodename() {
  if [ -n "${SLURMD_NODENAME:-}" ]; then echo "$SLURMD_NODENAME"; else hostname -s; fi
}

# The UUID of the GPU whose device file is /dev/nvidia<minor>, from the driver's /proc files.
# NVML's index follows PCI order, which need not match the minor numbers Slurm's gres.conf
# (File=/dev/nvidiaN, or AutoDetect=nvml) counts by, so an index could name another job's GPU.
gpudiag_uuid_of_minor() {
  local minor="$1" info uuid m
  for info in "$GPUDIAG_PROC_GPUS"/*/information; do
    [ -r "$info" ] || continue
    m=$(awk -F':' '/^Device Minor:/ {gsub(/[ \t]/, "", $2); print $2}' "$info")
    if [ "$m" = "$minor" ]; then
      uuid=$(awk -F':' '/^GPU UUID:/ {gsub(/[ \t]/, "", $2); print $2}' "$info")
      [ -n "$uuid" ] && { echo "$uuid"; return 0; }
    fi
  done
  return 1
}

# Fills GPUDIAG_DEVICE_ARGS (`--device X` pairs) and GPUDIAG_JOB_GPUS from the job's GPU list:
# SLURM_JOB_GPUS (what slurmd gives prologs and epilogs), else CUDA_VISIBLE_DEVICES. Returns 1
# when the job has no GPU, so the caller checks nothing rather than every GPU of the node.
gpudiag_job_devices() {
  local ids="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}" id uuid
  GPUDIAG_DEVICE_ARGS=()
  GPUDIAG_JOB_GPUS="$ids"
  case "$GPUDIAG_GPU_IDS" in
    minor | index) ;;
    *) gpudiag_die_config "GPUDIAG_GPU_IDS must be 'minor' or 'index', not '$GPUDIAG_GPU_IDS'" ;;
  esac
  [ -n "$ids" ] || return 1
  IFS=',' read -r -a _gpudiag_ids <<<"$ids"
  for id in "${_gpudiag_ids[@]}"; do
    id="${id// /}"
    [ -n "$id" ] || continue
    case "$id" in
      GPU-* | MIG-*) GPUDIAG_DEVICE_ARGS+=(--device "$id") ;;
      *[!0-9]*) gpudiag_die_config "job GPU id '$id' (from '$ids') is neither a number nor a UUID" ;;
      *)
        if [ "$GPUDIAG_GPU_IDS" = minor ] && uuid=$(gpudiag_uuid_of_minor "$id"); then
          GPUDIAG_DEVICE_ARGS+=(--device "$uuid")
        else
          # No /proc/driver/nvidia (another vendor, or a container): the number is all there is.
          GPUDIAG_DEVICE_ARGS+=(--device "$id")
        fi
        ;;
    esac
  done
  [ ${#GPUDIAG_DEVICE_ARGS[@]} -gt 0 ]
}

# Runs `gpudiag check --json ARGS...` into file $1 (stderr into $1.stderr), bounded by
# GPUDIAG_TIMEOUT seconds where `timeout` exists; sets GPUDIAG_RC.
gpudiag_check_into() {
  local out="$1"
  shift
  command -v "$GPUDIAG_BIN" >/dev/null 2>&1 \
    || { GPUDIAG_RC=127; echo "$GPUDIAG_BIN not found on PATH" >"$out.stderr"; : >"$out"; return; }
  local cmd=("$GPUDIAG_BIN" check --json "$@")
  if command -v timeout >/dev/null 2>&1; then cmd=(timeout "$GPUDIAG_TIMEOUT" "${cmd[@]}"); fi
  GPUDIAG_RC=0
  "${cmd[@]}" >"$out" 2>"$out.stderr" || GPUDIAG_RC=$?
}

command -v python3 >/dev/null 2>&1 || {
  gpudiag_log "python3 is needed to read gpudiag's JSON report and was not found"
  exit 2
}
