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
: "${GPUDIAG_SYSLOG:=1}"
: "${GPUDIAG_STATE_DIR:=/run/gpudiag-slurm}"

# Slurm keeps a prolog's output nowhere useful: say it on stderr (slurmd's log) and in syslog.
gpudiag_log() {
  echo "${GPUDIAG_TAG:-gpudiag}: $*" >&2
  if [ "$GPUDIAG_SYSLOG" = 1 ] && command -v logger >/dev/null 2>&1; then
    logger -t "${GPUDIAG_TAG:-gpudiag}" -- "$*" || true
  fi
}

# Setting $1 must be one of $3...; a typo falls back to its documented default $2, said in the
# log, rather than stopping the script: a failing prolog or epilog drains the node, and one
# typo in a shared configuration would drain every node at its next job.
gpudiag_choice() {
  local name="$1" default="$2" allowed
  shift 2
  for allowed in "$@"; do
    [ "${!name:-}" != "$allowed" ] || return 0
  done
  gpudiag_log "configuration: $name='${!name:-}' is not one of: $*; using $default"
  printf -v "$name" '%s' "$default"
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

# The PCI bus ("0000:19:00.0") of the job GPU named $1 (a UUID, or a device minor where
# GPUDIAG_GPU_IDS=minor), from the driver's /proc files; fails where they do not say.
gpudiag_bus_of() {
  local id="$1" key info value
  case "$id" in
    GPU-* | MIG-*) key="GPU UUID" ;;
    *) [ "$GPUDIAG_GPU_IDS" = minor ] || return 1; key="Device Minor" ;;
  esac
  for info in "$GPUDIAG_PROC_GPUS"/*/information; do
    [ -r "$info" ] || continue
    value=$(awk -F':' -v key="$key" '$1 == key {sub(/^[^:]*:[ \t]*/, ""); gsub(/[ \t]/, ""); print}' "$info")
    if [ "$value" = "$id" ]; then
      awk '/^Bus Location:/ {print $3}' "$info"
      return 0
    fi
  done
  return 1
}

# Fills GPUDIAG_DEVICE_ARGS (`--device X` pairs), GPUDIAG_JOB_IDS and GPUDIAG_JOB_GPUS from the job's GPU list:
# SLURM_JOB_GPUS (what slurmd gives prologs and epilogs), else CUDA_VISIBLE_DEVICES. Returns 1
# when the job has no GPU, so the caller checks nothing rather than every GPU of the node.
gpudiag_job_devices() {
  local ids="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}" id uuid
  GPUDIAG_DEVICE_ARGS=()
  GPUDIAG_JOB_GPUS="$ids"
  [ -n "$ids" ] || return 1
  IFS=',' read -r -a _gpudiag_ids <<<"$ids"
  GPUDIAG_JOB_IDS=()
  for id in "${_gpudiag_ids[@]}"; do
    id="${id// /}"
    [ -n "$id" ] || continue
    GPUDIAG_JOB_IDS+=("$id")
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

# A whole number of seconds from setting $1, else its default $2, said in the log: a typo in
# one setting must not stop the check, nor drain every node at its next job.
gpudiag_seconds() {
  local name="$1" default="$2"
  case "${!name:-}" in
    '' | *[!0-9]* | 0)
      [ -z "${!name:-}" ] \
        || gpudiag_log "configuration: $name='${!name}' is not a number of seconds: using $default"
      printf -v "$name" '%s' "$default"
      ;;
  esac
}
gpudiag_choice GPUDIAG_GPU_IDS minor minor index
gpudiag_seconds GPUDIAG_TIMEOUT 300
gpudiag_seconds GPUDIAG_KILL_GRACE 10

# The scheduling state of process $1 (R, S, D...) from /proc, empty when unknown.
gpudiag_proc_state() {
  local stat
  stat=$(cat "${GPUDIAG_PROC:-/proc}/$1/stat" 2>/dev/null) || return 0
  stat="${stat##*) }"
  echo "${stat%% *}"
}

# Waits up to $2 seconds for process $1 to end; returns 1 if it is still there.
gpudiag_wait_for() {
  local pid="$1" ticks=$(($2 * 5))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$ticks" -gt 0 ] || return 1
    ticks=$((ticks - 1))
    sleep 0.2
  done
}

# Runs `gpudiag check --json ARGS...` into file $1 (stderr into $1.stderr); sets GPUDIAG_RC and
# GPUDIAG_OUTCOME: `exited`, `timed_out` (stopped by a signal after GPUDIAG_TIMEOUT seconds: a
# fault of gpudiag's, not proof of a GPU's) or `hung` (after GPUDIAG_TIMEOUT it was stuck in the
# kernel: in state D GPUDIAG_KILL_GRACE seconds after SIGTERM, or alive GPUDIAG_KILL_GRACE seconds
# after SIGKILL; a driver call that does not return says its GPU is broken). A hung gpudiag is
# left behind, never waited for, so the script ends within GPUDIAG_TIMEOUT + 2 x
# GPUDIAG_KILL_GRACE seconds whatever gpudiag does; `timeout` would wait on it forever.
gpudiag_check_into() {
  local out="$1" pid state
  shift
  GPUDIAG_RC=0 GPUDIAG_OUTCOME=exited
  command -v "$GPUDIAG_BIN" >/dev/null 2>&1 \
    || { GPUDIAG_RC=127; echo "$GPUDIAG_BIN not found on PATH" >"$out.stderr"; : >"$out"; return; }
  # Its own process group, so the signals reach whatever gpudiag started too.
  set -m
  "$GPUDIAG_BIN" check --json "$@" >"$out" 2>"$out.stderr" </dev/null &
  pid=$!
  set +m
  if ! gpudiag_wait_for "$pid" "$GPUDIAG_TIMEOUT"; then
    GPUDIAG_OUTCOME=timed_out
    kill -TERM -- "-$pid" 2>/dev/null
    if ! gpudiag_wait_for "$pid" "$GPUDIAG_KILL_GRACE"; then
      state=$(gpudiag_proc_state "$pid")
      [ "$state" != D ] || GPUDIAG_OUTCOME=hung
      kill -KILL -- "-$pid" 2>/dev/null
      if ! gpudiag_wait_for "$pid" "$GPUDIAG_KILL_GRACE"; then
        GPUDIAG_OUTCOME=hung GPUDIAG_RC=137
        return
      fi
    fi
  fi
  wait "$pid" 2>/dev/null
  GPUDIAG_RC=$?
}

command -v python3 >/dev/null 2>&1 || {
  gpudiag_log "python3 is needed to read gpudiag's JSON report and was not found"
  exit 2
}
