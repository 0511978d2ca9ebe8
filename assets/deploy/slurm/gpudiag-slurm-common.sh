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
: "${GPUDIAG_NODE_COMMENT:=1}"
# `--check-config`: the admin's dry run, which changes nothing (see gpudiag_check_config).
GPUDIAG_DRY_RUN=0
[ "${1:-}" != --check-config ] || GPUDIAG_DRY_RUN=1
# Faults of the install or the configuration met so far (see gpudiag_settle_faults).
GPUDIAG_FAULTS=()

# Slurm keeps a prolog's output nowhere useful: say it on stderr (slurmd's log) and in syslog.
gpudiag_log() {
  echo "${GPUDIAG_TAG:-gpudiag}: $*" >&2
  if [ "$GPUDIAG_SYSLOG" = 1 ] && [ "$GPUDIAG_DRY_RUN" = 0 ] && command -v logger >/dev/null 2>&1; then
    logger -t "${GPUDIAG_TAG:-gpudiag}" -- "$*" || true
  fi
}

# A fault of the install or the configuration, not of a GPU: logged now, made loud when the
# script ends (gpudiag_settle_faults), and never a reason to drain.
gpudiag_fault() {
  GPUDIAG_FAULTS+=("$*")
  gpudiag_log "install or configuration fault (the node is not drained for it): $*"
}

# The node's name as slurmctld knows it; slurmd sets SLURMD_NODENAME, `hostname -s` is the
# usual fallback where the node name and the host name agree.
gpudiag_nodename() {
  if [ -n "${SLURMD_NODENAME:-}" ]; then echo "$SLURMD_NODENAME"; else hostname -s; fi
}

# A failing prolog or epilog drains its node, and one slip in a shared install (a typo, a
# missing binary) would drain every node at its next job; so a fault of the install never
# fails the script. It is made loud instead, where an admin looks: syslog (gpudiag_log), a
# state file GPUDIAG_STATE_DIR/<script>.fault holding the faults (for a health check to find),
# and, with GPUDIAG_NODE_COMMENT=1, the node's comment in `scontrol show node` (a Slurm
# without node comments refuses it, which is logged). The comment is set when the faults change,
# not at every job, and cleared, with the file, by the first run without a fault.
gpudiag_settle_faults() {
  [ "$GPUDIAG_DRY_RUN" = 0 ] || return 0
  local file="$GPUDIAG_STATE_DIR/$GPUDIAG_TAG.fault" old="" now comment
  [ -r "$file" ] && old=$(cat "$file" 2>/dev/null)
  if [ ${#GPUDIAG_FAULTS[@]} -eq 0 ]; then
    [ -e "$file" ] || return 0
    rm -f "$file"
    gpudiag_log "no install or configuration fault any more (was: $old)"
    comment=""
  else
    now=$(printf '%s; ' "${GPUDIAG_FAULTS[@]}")
    now="${now%; }"
    mkdir -p "$GPUDIAG_STATE_DIR" 2>/dev/null
    printf '%s\n' "$now" >"$file" 2>/dev/null || gpudiag_log "cannot write $file"
    [ "$now" != "$old" ] || return 0
    comment="$GPUDIAG_TAG: ${now:0:200}"
  fi
  if [ "$GPUDIAG_NODE_COMMENT" = 1 ]; then
    scontrol update nodename="$(gpudiag_nodename)" comment="$comment" >/dev/null 2>&1 \
      || gpudiag_log "scontrol could not set the node's comment"
  fi
}

# Setting $1 must be one of $3...; a typo falls back to its documented default $2, said in the
# log and made loud as a fault, rather than stopping the script.
gpudiag_choice() {
  local name="$1" default="$2" allowed
  shift 2
  for allowed in "$@"; do
    [ "${!name:-}" != "$allowed" ] || return 0
  done
  gpudiag_fault "configuration: $name='${!name:-}' is not one of: $*; using $default"
  printf -v "$name" '%s' "$default"
}

# `gpudiag slurm ACTION...` with the settings that say how the job's GPUs are numbered. It
# reads files only (never a GPU), so unlike the check it needs no deadline.
gpudiag_slurm() {
  "$GPUDIAG_BIN" slurm --ids "$GPUDIAG_GPU_IDS" --proc-gpus "$GPUDIAG_PROC_GPUS" "$@"
}

# Fills GPUDIAG_DEVICE_ARGS (`--device X` pairs) from the job's GPU list (SLURM_JOB_GPUS, else
# CUDA_VISIBLE_DEVICES), mapped by `gpudiag slurm devices`: a device minor becomes its GPU's
# UUID through the driver's /proc files, never an NVML index (PCI order, which can name
# another job's GPU). Sets GPUDIAG_DEVICES_OUTCOME: `gpus`; `none` (a job without GPUs: the
# caller checks nothing rather than every GPU of the node); `config_error` (a list that does
# not parse, a UUID or minor the driver does not list); `cannot_tell` (minors, and no /proc
# listing to map them); `tool_error` (gpudiag missing or too old). GPUDIAG_DEVICES_WHY says why.
gpudiag_job_devices() {
  local out rc line
  GPUDIAG_DEVICE_ARGS=()
  GPUDIAG_JOB_GPUS="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
  GPUDIAG_DEVICES_WHY=""
  if ! command -v "$GPUDIAG_BIN" >/dev/null 2>&1; then
    GPUDIAG_DEVICES_OUTCOME=tool_error GPUDIAG_DEVICES_WHY="$GPUDIAG_BIN not found on PATH"
    return
  fi
  # Its output is the list, or (on failure, with nothing on stdout) why.
  out=$(gpudiag_slurm devices 2>&1)
  rc=$?
  case "$rc" in
    0)
      while IFS= read -r line; do
        [ -z "$line" ] || GPUDIAG_DEVICE_ARGS+=(--device "$line")
      done <<<"$out"
      GPUDIAG_DEVICES_OUTCOME=none
      [ ${#GPUDIAG_DEVICE_ARGS[@]} -eq 0 ] || GPUDIAG_DEVICES_OUTCOME=gpus
      return
      ;;
    2) GPUDIAG_DEVICES_OUTCOME=config_error ;;
    3) GPUDIAG_DEVICES_OUTCOME=cannot_tell ;;
    *) GPUDIAG_DEVICES_OUTCOME=tool_error ;;
  esac
  out=$(printf '%s' "$out" | head -c 600 | tr '\n' ' ')
  GPUDIAG_DEVICES_WHY="${out#gpudiag: }"
  # A gpudiag older than these scripts has no `slurm`: clap's usage error, exit 2.
  if [ "$rc" = 2 ] && ! "$GPUDIAG_BIN" slurm --help >/dev/null 2>&1; then
    GPUDIAG_DEVICES_OUTCOME=tool_error
    GPUDIAG_DEVICES_WHY="$GPUDIAG_BIN has no 'slurm' subcommand (older than these scripts)"
  fi
  [ "$GPUDIAG_DEVICES_OUTCOME" != tool_error ] || [ "$rc" = 2 ] \
    || GPUDIAG_DEVICES_WHY="gpudiag slurm devices failed (exit $rc): $GPUDIAG_DEVICES_WHY"
}

# `prolog --check-config`, `epilog --check-config`: what an admin runs on a node before
# rolling the scripts out, and after changing /etc/gpudiag/slurm.conf. It changes nothing (no
# drain, no node comment, no state file, no syslog) and prints each problem; the prolog's then
# runs the check on the GPUs the driver lists (or SLURM_JOB_GPUS, when set) and says what it
# would do. Exit 0 when there is no problem, 1 otherwise: it is run by hand, not by slurmd.
gpudiag_check_config() {
  local dir n=0 fault
  GPUDIAG_PROBLEMS=0
  gpudiag_problem() { echo "problem: $*"; GPUDIAG_PROBLEMS=$((GPUDIAG_PROBLEMS + 1)); }
  for fault in "${GPUDIAG_FAULTS[@]}"; do gpudiag_problem "$fault"; done
  if ! command -v "$GPUDIAG_BIN" >/dev/null 2>&1; then
    gpudiag_problem "GPUDIAG_BIN=$GPUDIAG_BIN is not on PATH: every job would run unchecked (logged as a tool error)"
  elif ! "$GPUDIAG_BIN" slurm --help >/dev/null 2>&1; then
    gpudiag_problem "$GPUDIAG_BIN has no 'slurm' subcommand: older than these scripts"
  else
    echo "ok: $("$GPUDIAG_BIN" --version 2>&1 | head -n 1)"
  fi
  command -v scontrol >/dev/null 2>&1 \
    || gpudiag_problem "scontrol is not on PATH: the prolog could not drain a node with a reason"
  if [ "$GPUDIAG_SYSLOG" = 1 ] && ! command -v logger >/dev/null 2>&1; then
    gpudiag_problem "logger is not on PATH: GPUDIAG_SYSLOG=1 cannot log to syslog"
  fi
  for dir in "$GPUDIAG_STATE_DIR" ${GPUDIAG_SUMMARY_DIR:+"$GPUDIAG_SUMMARY_DIR"}; do
    if [ -d "$dir" ]; then
      [ -w "$dir" ] || gpudiag_problem "$dir is not writable"
    elif ! mkdir -p "$dir" 2>/dev/null; then
      gpudiag_problem "$dir cannot be created"
    else
      rmdir "$dir" 2>/dev/null
      echo "ok: $dir can be created"
    fi
  done
  if [ -d "$GPUDIAG_PROC_GPUS" ]; then
    for dir in "$GPUDIAG_PROC_GPUS"/*/information; do [ -r "$dir" ] && n=$((n + 1)); done
    echo "ok: the driver lists $n GPU(s) in $GPUDIAG_PROC_GPUS"
  elif [ "$GPUDIAG_GPU_IDS" = minor ]; then
    gpudiag_problem "$GPUDIAG_PROC_GPUS cannot be read: device minors cannot be mapped to GPUs, so no job's GPU would be checked (GPUDIAG_GPU_IDS=index if SLURM_JOB_GPUS holds NVML indices)"
  else
    echo "note: $GPUDIAG_PROC_GPUS cannot be read: a job GPU NVML no longer sees cannot be told from a configuration error (logged, not drained)"
  fi
}

# A whole number of seconds from setting $1, else its default $2, said in the log: a typo in
# one setting must not stop the check, nor drain every node at its next job.
gpudiag_seconds() {
  local name="$1" default="$2"
  case "${!name:-}" in
    '' | *[!0-9]* | 0)
      [ -z "${!name:-}" ] \
        || gpudiag_fault "configuration: $name='${!name}' is not a number of seconds: using $default"
      printf -v "$name" '%s' "$default"
      ;;
  esac
}
gpudiag_choice GPUDIAG_GPU_IDS minor minor index
gpudiag_choice GPUDIAG_SYSLOG 1 1 0
gpudiag_choice GPUDIAG_NODE_COMMENT 1 1 0
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

