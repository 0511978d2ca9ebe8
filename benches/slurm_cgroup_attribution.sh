#!/usr/bin/env bash
# Process attribution on a real GPU host: a Python process holding GPU memory is started inside
# a cgroup named like Slurm's (slurm/uid_0/job_4242/step_0), a second one outside any such
# cgroup with SLURM_JOB_ID=4243 in its environment, and `gpudiag check --json --window 2s` and
# `gpudiag serve` must name their jobs (found in the cgroup, and in the environment).
#
# Run as root (creating cgroups needs it), from the repository root:
#   sudo GPUDIAG_BIN=.gpu-bundle/gpudiag bash benches/slurm_cgroup_attribution.sh
# Needs python3 with torch and one CUDA GPU. Exit codes: 0 attributed as expected, 1 not,
# 2 this host does not allow it (no writable cgroup hierarchy: a container, or not root).
set -u

BIN=${GPUDIAG_BIN:-target/release/gpudiag}
JOB=4242
ENV_JOB=4243
CGROOT=/sys/fs/cgroup
WORK=$(mktemp -d)
PIDS=()
CREATED=()

cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    # Deepest first; a cgroup can be removed once it holds no process.
    for ((i=${#CREATED[@]}-1; i>=0; i--)); do rmdir "${CREATED[$i]}" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

not_allowed() {
    echo "NOT POSSIBLE ON THIS HOST: $1"
    echo "Slurm cgroup attribution is then covered only by the fixture tests (tests/attribution.rs)."
    exit 2
}

[ -x "$BIN" ] || { echo "no gpudiag binary at $BIN (set GPUDIAG_BIN)"; exit 1; }
[ "$(id -u)" = 0 ] || not_allowed "not root: creating cgroups needs root"

# cgroup v2 has one hierarchy; v1 one per controller, where the memory one will do (slurmd's v1
# plugin makes the same path under each controller it uses).
if [ "$(stat -fc %T "$CGROOT")" = cgroup2fs ]; then
    VERSION=v2
    BASE=$CGROOT
else
    VERSION=v1
    BASE=$CGROOT/memory
    [ -d "$BASE" ] || not_allowed "cgroup v1 without a memory hierarchy at $BASE"
fi
LEAF=$BASE/slurm/uid_0/job_$JOB/step_0
for d in "$BASE/slurm" "$BASE/slurm/uid_0" "$BASE/slurm/uid_0/job_$JOB" "$LEAF"; do
    if [ ! -d "$d" ]; then
        mkdir "$d" 2>"$WORK/mkdir.err" || not_allowed "cannot create $d ($VERSION): $(cat "$WORK/mkdir.err")"
        CREATED+=("$d")
    fi
done
echo "cgroup $VERSION: created $LEAF"

HOLD='import torch, time
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(300)'

# Born inside the job's cgroup: the shell moves itself in, then becomes Python.
sh -c "echo \$\$ > '$LEAF/cgroup.procs' && exec python3 -c '$HOLD'" >"$WORK/in_cgroup.out" 2>&1 &
PIDS+=($!)
IN_CGROUP=$!
# Outside any Slurm cgroup, its job only in its environment.
SLURM_JOB_ID=$ENV_JOB SLURM_JOB_USER=root python3 -c "$HOLD" >"$WORK/in_env.out" 2>&1 &
PIDS+=($!)
IN_ENV=$!

for _ in $(seq 60); do
    grep -q ready "$WORK/in_cgroup.out" && grep -q ready "$WORK/in_env.out" && break
    sleep 1
done
if ! grep -q ready "$WORK/in_cgroup.out"; then
    echo "the process in the cgroup did not start:"; cat "$WORK/in_cgroup.out"
    grep -q "Permission denied\|Invalid argument\|Device or resource busy" "$WORK/in_cgroup.out" \
        && not_allowed "cannot move a process into $LEAF"
    exit 1
fi
grep -q ready "$WORK/in_env.out" || { echo "the second process did not start:"; cat "$WORK/in_env.out"; exit 1; }
echo "pid $IN_CGROUP: $(cat /proc/$IN_CGROUP/cgroup | tr '\n' ' ')"
echo "pid $IN_ENV: SLURM_JOB_ID=$ENV_JOB in its environment"

"$BIN" check --json --window 2s >"$WORK/check.json" 2>"$WORK/check.err"
CODE=$?
echo "gpudiag check --json --window 2s: exit $CODE"
if [ $CODE -gt 1 ]; then
    echo "gpudiag could not check the GPUs:"; cat "$WORK/check.err"
    exit 1
fi
python3 - "$WORK/check.json" "$IN_CGROUP" "$IN_ENV" "$JOB" "$ENV_JOB" <<'PY'
import json, sys
path, in_cgroup, in_env, job, env_job = sys.argv[1:]
report = json.load(open(path))
seen = {}
for d in report["devices"]:
    for p in (d.get("latest") or {}).get("processes") or []:
        seen[str(p["pid"])] = p
        print(f"GPU {d['info']['index']} pid {p['pid']} {p.get('name')}: "
              f"{json.dumps(p.get('attribution'))}")
ok = True
for pid, want, where in [(in_cgroup, job, "cgroup"), (in_env, env_job, "environ")]:
    job_seen = ((seen.get(pid) or {}).get("attribution") or {}).get("job") or {}
    good = job_seen.get("id") == want and job_seen.get("found_in") == where
    print(f"pid {pid}: job {job_seen.get('id')} found in {job_seen.get('found_in')}: "
          f"{'OK' if good else 'WRONG (want ' + want + ' from ' + where + ')'}")
    ok &= good
sys.exit(0 if ok else 1)
PY
CHECK=$?

# The same through serve: the per-process series carry slurm_job.
"$BIN" serve --listen 127.0.0.1:0 >/dev/null 2>"$WORK/serve.err" &
PIDS+=($!)
sleep 4
ADDR=$(head -1 "$WORK/serve.err" | sed -n 's#.*http://\([^/]*\)/metrics.*#\1#p')
[ -n "$ADDR" ] || { echo "gpudiag serve did not start:"; cat "$WORK/serve.err"; exit 1; }
python3 - "$ADDR" "$JOB" <<'PY'
import sys, urllib.request
addr, job = sys.argv[1:]
text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
lines = [l for l in text.splitlines() if l.startswith("gpudiag_process_memory_used_bytes")]
print("\n".join(lines))
sys.exit(0 if any(f'slurm_job="{job}"' in l for l in lines) else 1)
PY
SERVE=$?

if [ $CHECK = 0 ] && [ $SERVE = 0 ]; then
    echo "RESULT: both processes attributed to their Slurm jobs (check and serve)"
    exit 0
fi
echo "RESULT: attribution did not come out as expected (check $CHECK, serve $SERVE)"
exit 1
