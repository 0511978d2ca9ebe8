#!/usr/bin/env bash
# What a reader sees in /proc of another user's training process: the files gpudiag's
# attribution reads (environ, cmdline, cgroup, stat, status, the exe and ns/net links), for each
# way a deployment runs, with /proc as it is and with a /proc mounted hidepid=2 (in a private
# mount namespace, so the host's /proc is left alone).
#
#   sudo benches/proc_visibility.sh            # prints a Markdown table; needs root
#   sudo TARGET=root benches/proc_visibility.sh   # the training process runs as root
#   sudo TARGET=root-nocaps benches/proc_visibility.sh   # as root with every capability dropped
#
# The process: `python3 -c 'sleep' --master-addr 10.1.2.3 --rdzv-id job-77` (torchrun's options
# on its command line) with MASTER_ADDR, RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID and SLURM_JOB_ID
# in its environment, run as a user of its own, and moved into a cgroup named as slurmd's v1
# plugin names a job's (/slurm/uid_N/job_4242/step_0/task_0) in the first writable cgroup v1
# hierarchy, else into a v2 cgroup /system.slice/train-4242.service; neither is a real Slurm or
# systemd: only the path is what a reader sees. Readers:
#   other user        : a second user, no capabilities (the systemd unit's DynamicUser)
#   other user+ptrace : the same with CAP_SYS_PTRACE ambient
#   other user+ptrace+dac : with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH ambient (environ is mode
#                       0400: the ptrace right alone does not open it)
#   uid 0, no caps    : root's uid with every capability dropped (the DaemonSet)
#   uid 0, ptrace only: root's uid with CAP_SYS_PTRACE alone
#   root              : the Slurm prolog and epilog
# The users are created with useradd and removed at the end; the cgroup too.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "needs root (useradd, runuser, setpriv, unshare)" >&2; exit 2; }
OWNER=gdvis_owner READER=gdvis_reader
made=()
for u in $OWNER $READER; do
  if ! id "$u" >/dev/null 2>&1; then
    useradd -M -r -s /usr/sbin/nologin "$u"
    made+=("$u")
  fi
done
cg="" cg_top=""
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true
  sleep 0.2
  # The directories this script made, innermost first, up to the first one it made.
  if [ -n "$cg" ] && [ -n "$cg_top" ]; then
    d=$cg
    while :; do rmdir "$d" 2>/dev/null || true; [ "$d" = "$cg_top" ] && break; d=$(dirname "$d"); done
  fi
  for u in "${made[@]}"; do userdel "$u" 2>/dev/null || true; done
}
trap cleanup EXIT

TARGET=${TARGET:-$OWNER}
drop=()
if [ "$TARGET" = root-nocaps ]; then
  TARGET=root
  drop=(setpriv --inh-caps=-all --bounding-set=-all)
fi
uid=$(id -u "$TARGET")
runuser -u "$TARGET" -- "${drop[@]}" env -i PATH=/usr/bin:/bin MASTER_ADDR=10.1.2.3 MASTER_PORT=29500 RANK=3 \
  WORLD_SIZE=8 TORCHELASTIC_RUN_ID=job-77 SLURM_JOB_ID=4242 \
  python3 -c 'import time; time.sleep(120)' --master-addr 10.1.2.3 --rdzv-id job-77 &
sleep 0.5
pid=$(pgrep -u "$TARGET" -n -f 'rdzv-id job-77')

# The outermost directory of $1 that does not exist yet.
first_missing() { local d=$1 top=""; while [ ! -e "$d" ]; do top=$d; d=$(dirname "$d"); done; echo "$top"; }
for h in /sys/fs/cgroup/pids /sys/fs/cgroup/memory /sys/fs/cgroup/cpu; do
  want="$h/slurm/uid_$uid/job_4242/step_0/task_0"
  top=$(first_missing "$want")
  if [ -d "$h" ] && mkdir -p "$want" 2>/dev/null; then
    cg=$want cg_top=$top
    echo "$pid" > "$want/cgroup.procs" 2>/dev/null && break
    cleanup_cg=$cg; cg=""; d=$cleanup_cg
    while [ -n "$top" ]; do rmdir "$d" 2>/dev/null || true; [ "$d" = "$top" ] && break; d=$(dirname "$d"); done
  fi
done
if [ -z "$cg" ] && [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  want=/sys/fs/cgroup/system.slice/train-4242.service
  top=$(first_missing "$want")
  if mkdir -p "$want" 2>/dev/null && echo "$pid" > "$want/cgroup.procs" 2>/dev/null; then
    cg=$want cg_top=$top
  fi
fi

# Why a file cannot be read, as the reader's open() says it.
errno_of() { python3 -c 'import os,sys
try: os.close(os.open(sys.argv[1], os.O_RDONLY)) if not sys.argv[1].endswith(("exe","net")) else os.readlink(sys.argv[1]); print("no error")
except OSError as e: print(e.strerror)' "$1"; }
export -f errno_of

# One reader's view of one file: what it holds (the keys gpudiag looks for), or the error.
look() { # $1 = file under /proc/PID
  local f=/proc/$pid/$1 out
  case $1 in
    exe|ns/net) out=$(readlink "$f" 2>&1) && echo "readable: $out" || echo "denied: $(errno_of "$f")" ;;
    environ) out=$({ tr '\0' '\n' < "$f"; } 2>/dev/null) \
      && echo "readable: $(echo "$out" | grep -E '^(MASTER_ADDR|RANK|TORCHELASTIC_RUN_ID|SLURM_JOB_ID)=' | paste -sd ' ')" \
      || echo "denied: $(errno_of "$f")" ;;
    cmdline) out=$({ tr '\0' ' ' < "$f"; } 2>/dev/null) && echo "readable: $out" || echo "denied: $(errno_of "$f")" ;;
    cgroup) out=$(cat "$f" 2>&1) && echo "readable: $(echo "$out" | grep -m1 -E 'slurm|system.slice' || echo "$out" | head -1)" \
      || echo "denied: $(errno_of "$f")" ;;
    stat) out=$(cat "$f" 2>&1) && echo "readable: ppid $(echo "$out" | sed 's/.*) //' | cut -d' ' -f2)" \
      || echo "denied: $(errno_of "$f")" ;;
    status) out=$(cat "$f" 2>&1) && echo "readable: $(echo "$out" | grep -m1 '^Uid:' | tr -s '\t ' ' ')" \
      || echo "denied: $(errno_of "$f")" ;;
  esac
}
export -f look
export pid

as_reader() { # $1 = reader name; runs `look` for every file as that reader
  local r=$1 f
  for f in environ cmdline cgroup stat status exe ns/net; do
    case $r in
      "other user") v=$(runuser -u $READER -- bash -c "look $f") ;;
      "other user+ptrace") v=$(setpriv --reuid "$(id -u $READER)" --regid "$(id -g $READER)" --clear-groups \
          --inh-caps +sys_ptrace --ambient-caps +sys_ptrace bash -c "look $f") ;;
      "other user+ptrace+dac") v=$(setpriv --reuid "$(id -u $READER)" --regid "$(id -g $READER)" --clear-groups \
          --inh-caps +sys_ptrace,+dac_read_search --ambient-caps +sys_ptrace,+dac_read_search bash -c "look $f") ;;
      "uid 0, no caps") v=$(setpriv --inh-caps=-all --bounding-set=-all bash -c "look $f") ;;
      "uid 0, ptrace only") v=$(setpriv --inh-caps=-all --bounding-set=-all,+sys_ptrace bash -c "look $f") ;;
      root) v=$(bash -c "look $f") ;;
    esac
    printf '| %s | %s | %s | %s |\n' "$2" "$r" "$f" "$v"
  done
}

echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -r), $(. /etc/os-release; echo "$PRETTY_NAME");" \
  "yama ptrace_scope $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo absent);" \
  "target pid $pid as $TARGET (uid $uid)${drop:+, every capability dropped}; cgroup: ${cg:-none could be made}"
echo
echo "| /proc | reader | file | what the reader got |"
echo "|---|---|---|---|"
for r in "other user" "other user+ptrace" "other user+ptrace+dac" "uid 0, no caps" "uid 0, ptrace only" root; do
  as_reader "$r" "as mounted"
done
# A proc instance of our own with hidepid=2, in a private mount namespace.
if unshare -m --propagation private true 2>/dev/null; then
  for r in "other user" "other user+ptrace" "other user+ptrace+dac" "uid 0, no caps" "uid 0, ptrace only" root; do
    unshare -m --propagation private bash -c "
      mount -t proc -o hidepid=2 proc /proc || exit 3
      $(declare -f look as_reader errno_of); export -f look errno_of; export pid=$pid READER=$READER
      as_reader '$r' 'hidepid=2'" || echo "| hidepid=2 | $r | – | could not mount proc with hidepid=2 (exit $?) |"
  done
else
  echo "| hidepid=2 | – | – | unshare -m is not permitted here |"
fi
