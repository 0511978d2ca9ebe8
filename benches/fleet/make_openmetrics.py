#!/usr/bin/env python3
"""A fleet's Prometheus history as an OpenMetrics file for `promtool tsdb create-blocks-from
openmetrics`: NODES nodes of 8 GPUs scraped every STEP seconds for the last MINUTES minutes up to
END, as a Prometheus scraping each node's exporter would have stored it.

    python3 benches/fleet/make_openmetrics.py OUT [--nodes 256] [--minutes 60] [--step 15]
        [--end UNIX_SECONDS] [--seed 1]

Every series comes from a real exposition, not an invented shape:
- benches/fleet/gpudiag-node.prom: `gpudiag serve --replay
  tests/fixtures/recordings/job8_straggler.ndjson` scraped 9 s into the replay (8 H100, one
  straggling GPU in a job), its job families (`gpudiag_job_*`) from a scrape 12 s in, taken
  when `gpudiag_job_gpu_role` replaced the straggler labels on `gpudiag_job_verdict`;
- tests/fixtures/prometheus/dcgm-exporter.prom: dcgm-exporter 3.x/4.x on one 4-GPU A100 node
  (its provenance is in tests/support/static_http.rs), extended here to 8 GPUs.

Each node gets its own Hostname and GPU UUIDs, and the `instance` and `job` labels a scrape
adds (`node-017:9835`/`gpudiag`, `node-017:9400`/`dcgm-exporter`). Every 10th node runs only
dcgm-exporter. A GPU's figures come from one of the template's GPUs according to what the GPU is
doing (template GPU 5 leads its job, GPU 0 waits for it); gauges vary with bounded noise and
counters grow at the rate their gauges imply. What makes the fleet worth looking at:
- multi-node Slurm jobs (`gpudiag_gpu_job_info`, job_key = the Slurm id, global ranks across
  nodes), one of them with a straggler GPU whose SM activity is twice its peers';
- a few GPUs with `throttle.hw_slowdown` (fail) or `pcie.link_downtrained` (warn) findings;
- 2 nodes down: `up` is 0 for the last --down-minutes (5) and none of their other series has a
  sample after that. Their last samples are then exactly at the edge of Prometheus's 5-minute
  lookback at END, so an instant query at END still returns them (2.x's lookback includes its
  start) and one a step later does not. Backfilled data cannot carry the staleness markers a
  live Prometheus writes when a target goes down.
`up` is 1 for every other target at every step.

The file is family by family (never interleaved), each series' samples in time order,
timestamps in seconds, `# EOF` last. Prints the file's figures on stderr.
"""
import argparse
import hashlib
import math
import pathlib
import random
import re
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
GPUDIAG_TEMPLATE = HERE / "gpudiag-node.prom"
DCGM_TEMPLATE = HERE.parent.parent / "tests/fixtures/prometheus/dcgm-exporter.prom"
GPUS = 8
GPUDIAG_PORT, DCGM_PORT = 9835, 9400

LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(path):
    """Families in order: name -> {type, help, samples: [(labels as (k, v) pairs, value)]}."""
    families = {}
    for line in path.read_text().splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            families.setdefault(name, {"samples": []})["help"] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            families.setdefault(name, {"samples": []})["type"] = kind
        elif line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name, _, labels = head.partition("{")
            pairs = LABEL.findall(labels.rstrip("}"))
            families.setdefault(name, {"samples": []})["samples"].append((pairs, value))
    return families


def per_gpu(family):
    """The family's samples by the template GPU they belong to (None for host-wide ones)."""
    out = {}
    for labels, value in family["samples"]:
        gpu = dict(labels).get("gpu")
        out.setdefault(None if gpu is None else int(gpu), []).append((labels, value))
    return out


def uuid_for(node, gpu):
    h = hashlib.sha1(f"{node}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def is_int(s):
    return re.fullmatch(r"-?[0-9]+", s) is not None


# Bounded noise per family: ("abs", amplitude) or ("rel", fraction of the value), then the
# bounds. Families not named keep the template's value (states, limits, link widths, flags).
NOISE = {
    "DCGM_FI_DEV_GPU_UTIL": ("abs", 2.0, 0, 100),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("rel", 0.15, 0, 100),
    "DCGM_FI_DEV_POWER_USAGE": ("rel", 0.04, 0, 700),
    "DCGM_FI_DEV_GPU_TEMP": ("abs", 1.5, 20, 95),
    "DCGM_FI_DEV_MEMORY_TEMP": ("abs", 1.5, 20, 100),
    "DCGM_FI_DEV_SM_CLOCK": ("abs", 15.0, 100, 1980),
    "DCGM_FI_PROF_SM_ACTIVE": ("rel", 0.05, 0, 1),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("rel", 0.05, 0, 1),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("rel", 0.03, 0, 1),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("rel", 0.05, 0, 1),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("rel", 0.08, 0, 1),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("rel", 0.08, 0, 1e12),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("rel", 0.08, 0, 1e12),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("rel", 0.10, 0, 1e11),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("rel", 0.10, 0, 1e11),
    "gpudiag_sample_age_seconds": ("uniform", 0.05, 1.0),
    "gpudiag_job_peers_wait_ratio": ("abs", 0.03, 0, 1),
}
# Counters that grow: family -> (the gauge whose rate they follow, units per gauge unit-second).
GROWS = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_POWER_USAGE", 1000.0),  # W -> mJ
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("DCGM_FI_DEV_GPU_UTIL", 2.0e6),
}


def fmt(v, as_int):
    if as_int:
        return str(int(round(v)))
    r = round(v, 4)
    return str(int(r)) if r == int(r) and abs(r) < 1e15 else repr(r)


class Series:
    __slots__ = ("prefix", "value", "family", "until")

    def __init__(self, family, labels, value, until):
        body = ",".join(f'{k}="{v}"' for k, v in labels)
        self.prefix = f"{family}{{{body}}} "
        self.family = family
        self.value = value
        self.until = until


def gpu_profiles(tmpl):
    """What each kind of GPU reads, per family, from the gpudiag template's GPUs: GPU 5 leads its
    job (the straggler), GPU 0 waits for it. A GPU of a balanced job reads like the leader
    without its power cap; an idle one like the template's host with nothing running."""
    by = {name: per_gpu(f) for name, f in tmpl.items()}

    def values(gpu):
        return {name: {dict(l).get("reason"): v for l, v in g.get(gpu, [])} for name, g in by.items()}

    lead, waiting = values(5), values(0)
    busy = {k: dict(v) for k, v in lead.items()}
    busy["DCGM_FI_DEV_POWER_USAGE"][None] = "642.7"
    busy["DCGM_FI_DEV_SM_CLOCK"][None] = waiting["DCGM_FI_DEV_SM_CLOCK"][None]
    busy["gpudiag_throttle_reason"] = dict(waiting["gpudiag_throttle_reason"])
    idle = {k: dict(v) for k, v in waiting.items()}
    total_fb = int(waiting["DCGM_FI_DEV_FB_USED"][None]) + int(waiting["DCGM_FI_DEV_FB_FREE"][None])
    for name, v in {
        "DCGM_FI_DEV_GPU_UTIL": "0",
        "DCGM_FI_DEV_MEM_COPY_UTIL": "0",
        "DCGM_FI_DEV_FB_USED": "0",
        "DCGM_FI_DEV_FB_FREE": str(total_fb),
        "DCGM_FI_DEV_POWER_USAGE": "71.3",
        "DCGM_FI_DEV_GPU_TEMP": "33",
        "DCGM_FI_DEV_MEMORY_TEMP": "38",
        "DCGM_FI_DEV_SM_CLOCK": "345",
        "DCGM_FI_PROF_SM_ACTIVE": "0",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0",
        "DCGM_FI_PROF_NVLINK_RX_BYTES": "0",
        "DCGM_FI_PROF_NVLINK_TX_BYTES": "0",
        "gpudiag_gpu_processes": "0",
    }.items():
        idle[name][None] = v
    idle["gpudiag_throttle_reason"]["gpu_idle"] = "1"
    return {"lead": lead, "waiting": waiting, "busy": busy, "idle": idle}


VERDICT = {  # per-GPU verdict labels by what the GPU does
    "lead": ("compute_bound", "high"),
    "busy": ("compute_bound", "high"),
    "waiting": ("waiting_for_peer", "medium"),
    # A peer of the straggler on another node: that node's gpudiag sees only its own GPUs,
    # busy at half their SM activity, and cannot name the peer they wait for.
    "peer_elsewhere": ("underfilled", "medium"),
    "idle": ("idle", "high"),
    "hw_slowdown": ("throttled", "high"),
}


def plan(nodes, down_nodes):
    """Who runs what: (kind per node, jobs as [(slurm id, [node indices])], GPU faults)."""
    kinds = ["dcgm" if i % 10 == 9 else "gpudiag" for i in range(nodes)]
    gd = [i for i in range(nodes) if kinds[i] == "gpudiag"]
    jobs, at, slurm = [], 0, 4812000
    for size in [64, 32, 16, 16, 8, 8, 4, 4, 2, 2, 2]:
        if at + size > len(gd) * 0.7:
            continue
        jobs.append((str(slurm), gd[at : at + size]))
        at, slurm = at + size, slurm + 37
    # Most of the rest run one-node jobs; the last sixth sits idle.
    while at < len(gd) * 5 // 6:
        jobs.append((str(slurm), [gd[at]]))
        at, slurm = at + 1, slurm + 3
    faults = {}
    for n, fault in [(0.12, "hw_slowdown"), (0.47, "hw_slowdown"), (0.2, "downtrained"),
                     (0.55, "downtrained"), (0.81, "downtrained")]:
        node = gd[int(len(gd) * n)]
        faults[(node, int(n * 100) % GPUS)] = fault
    return kinds, jobs, faults


def down_set(nodes, kinds):
    gd = [i for i in range(nodes) if kinds[i] == "gpudiag"]
    dc = [i for i in range(nodes) if kinds[i] == "dcgm"]
    out = {gd[len(gd) * 3 // 10]} if gd else set()
    if dc:
        out.add(dc[-1])
    elif len(gd) > 1:
        out.add(gd[-1])
    return out


def build(args):
    tmpl_a, tmpl_b = parse(GPUDIAG_TEMPLATE), parse(DCGM_TEMPLATE)
    prof = gpu_profiles(tmpl_a)
    n = args.nodes
    kinds, jobs, faults = plan(n, None)
    down = down_set(n, kinds)
    end = args.end
    down_from = end - args.down_minutes * 60
    job_of = {}
    straggler_job = jobs[4][0] if len(jobs) > 4 else (jobs[0][0] if jobs else None)
    straggler = None
    for jid, members in jobs:
        for pos, node in enumerate(members):
            job_of[node] = (jid, pos)
        if jid == straggler_job:
            straggler = (members[len(members) // 2], 5)

    fam_order, fam_meta, series = [], {}, {}

    def family(name, meta):
        if name not in fam_meta:
            fam_order.append(name)
            fam_meta[name] = meta
            series[name] = []

    def add(name, labels, value, until, node):
        series[name].append((node, Series(name, labels, value, until)))

    for name, f in tmpl_a.items():
        family(name, f)
    for name, f in tmpl_b.items():
        family(name, f)
    family("up", {"type": "gauge", "help": "1 if the target was scraped, 0 if not."})

    b_gpu = {name: per_gpu(f) for name, f in tmpl_b.items()}
    a_gpu = {name: per_gpu(f) for name, f in tmpl_a.items()}
    for node in range(n):
        host = f"node-{node:03d}"
        until = down_from if node in down else end
        if kinds[node] == "dcgm":
            scrape = [("instance", f"{host}:{DCGM_PORT}"), ("job", "dcgm-exporter")]
            for name, g in b_gpu.items():
                for gpu in range(GPUS):
                    # GPUs 4-7 repeat 0-3 (two in a pod, two idle) on the next PCIe buses.
                    for labels, value in g[gpu % 4]:
                        lab = []
                        for k, v in labels:
                            if k == "gpu":
                                v = str(gpu)
                            elif k == "UUID":
                                v = uuid_for(host, gpu)
                            elif k == "pci_bus_id" and gpu >= 4:
                                v = f"00000000:{int(v[9:11], 16) + 0x80:02X}{v[11:]}"
                            elif k == "device":
                                v = f"nvidia{gpu}"
                            elif k == "Hostname":
                                v = host
                            elif k == "pod":
                                v = f"{v[:-1]}{node}-{gpu // 4}"
                            lab.append((k, v))
                        add(name, lab + scrape, value, until, node)
        else:
            scrape = [("instance", f"{host}:{GPUDIAG_PORT}"), ("job", "gpudiag")]
            job = job_of.get(node)
            gpu_kind = {}
            for gpu in range(GPUS):
                if job is None:
                    k = "idle"
                elif job[0] == straggler_job:
                    if (node, gpu) == straggler:
                        k = "lead"
                    elif node == straggler[0]:
                        k = "waiting"
                    else:
                        k = "peer_elsewhere"
                else:
                    k = "busy"
                gpu_kind[gpu] = k
            findings = []  # (gpu, id, severity)
            for gpu in range(GPUS):
                fault = faults.get((node, gpu))
                if fault == "hw_slowdown" and gpu_kind[gpu] != "idle":
                    gpu_kind[gpu] = "hw_slowdown"
                    findings.append((gpu, "throttle.hw_slowdown", "fail"))
                elif fault == "downtrained":
                    findings.append((gpu, "pcie.link_downtrained", "warn"))
            if straggler and node == straggler[0]:
                findings.append((straggler[1], "job.straggler", "warn"))
                findings.append((straggler[1], "throttle.sw_power_cap", "info"))
            uuid = {gpu: uuid_for(host, gpu) for gpu in range(GPUS)}

            def gpu_labels(gpu, extra=()):
                base = a_gpu["DCGM_FI_DEV_GPU_UTIL"][gpu][0][0]
                lab = [
                    (k, str(gpu) if k == "gpu" else uuid[gpu] if k == "UUID" else host if k == "Hostname" else v)
                    for k, v in base
                ]
                return lab + list(extra) + scrape

            for name, g in a_gpu.items():
                if name in ("gpudiag_gpu_job_info", "gpudiag_job_verdict", "gpudiag_job_gpu_role",
                            "gpudiag_job_peers_wait_ratio",
                            "gpudiag_finding", "gpudiag_findings", "gpudiag_verdict",
                            "gpudiag_process_memory_used_bytes", "gpudiag_process_verdict"):
                    continue
                for gpu in range(GPUS):
                    kind = gpu_kind[gpu]
                    source = prof["waiting" if kind == "peer_elsewhere" else "busy" if kind == "hw_slowdown" else kind]
                    for labels, _ in g.get(gpu, []):
                        reason = dict(labels).get("reason")
                        value = source[name][reason]
                        if kind == "hw_slowdown":
                            if name == "gpudiag_throttle_reason" and reason == "hw_slowdown":
                                value = "1"
                            elif name == "DCGM_FI_DEV_SM_CLOCK":
                                value = "1095"
                            elif name == "DCGM_FI_PROF_SM_ACTIVE":
                                value = "0.61"
                            elif name == "DCGM_FI_DEV_POWER_USAGE":
                                value = "402.5"
                        if (node, gpu) in faults and faults[(node, gpu)] == "downtrained":
                            if name == "gpudiag_pcie_link_width":
                                value = "8"
                        extra = [("reason", reason)] if reason is not None else []
                        add(name, gpu_labels(gpu, extra), value, until, node)
                for labels, value in g.get(None, []):
                    lab = [(k, host if k == "Hostname" else v) for k, v in labels]
                    add(name, lab + scrape, value, until, node)
            for gpu in range(GPUS):
                verdict, conf = VERDICT[gpu_kind[gpu]]
                add("gpudiag_verdict", gpu_labels(gpu, [("verdict", verdict), ("confidence", conf),
                                                        ("basis", "profiling_counters")]), "1", until, node)
                if job is not None:
                    pid = str(20000 + (node * 131 + gpu * 7) % 40000)
                    who = [("pid", pid), ("process", "python3.12"), ("user", "trainer")]
                    add("gpudiag_process_memory_used_bytes", gpu_labels(gpu, who), "66571993088", until, node)
                    add("gpudiag_process_verdict", gpu_labels(gpu, who + [
                        ("verdict", verdict), ("confidence", conf), ("basis", "profiling_counters")]),
                        "1", until, node)
                    jid, pos = job
                    add("gpudiag_gpu_job_info", [
                        ("UUID", uuid[gpu]), ("gpu", str(gpu)), ("Hostname", host), ("job_key", jid),
                        ("joined_by", "slurm_job"), ("slurm_job", jid), ("rank", str(pos * GPUS + gpu))] + scrape,
                        "1", until, node)
            if job is not None:
                jid, _ = job
                head = [("Hostname", host), ("job_key", jid), ("joined_by", "slurm_job")]
                if straggler and node == straggler[0]:
                    sg = straggler[1]
                    add("gpudiag_job_verdict", head + [
                        ("verdict", "straggler"), ("confidence", "high")] + scrape, "1", until, node)
                    # The straggler, and the node's other GPUs of the job waiting for it.
                    for gpu in range(GPUS):
                        role = "straggler" if gpu == sg else "waiting"
                        add("gpudiag_job_gpu_role", head + [
                            ("UUID", uuid[gpu]), ("gpu", str(gpu)), ("role", role)] + scrape, "1", until, node)
                    add("gpudiag_job_peers_wait_ratio", head + scrape, "0.5", until, node)
                else:
                    add("gpudiag_job_verdict", head + [("verdict", "balanced"), ("confidence", "high")] + scrape,
                        "1", until, node)
            for gpu, fid, sev in findings:
                add("gpudiag_finding", gpu_labels(gpu, [("id", fid), ("severity", sev)]), "1", until, node)
            for sev in ("info", "warn", "fail"):
                count = sum(1 for f in findings if f[2] == sev)
                add("gpudiag_findings", [("Hostname", host), ("severity", sev)] + scrape, str(count), until, node)
        add("up", scrape, "down" if node in down else "1", end, node)
    facts = {
        "kinds": kinds, "jobs": jobs, "faults": faults, "down": sorted(down),
        "straggler": straggler, "straggler_job": straggler_job,
    }
    return fam_order, fam_meta, series, facts


def samples(s, times, rng, rates, down_from):
    """The series' values at `times`, as strings."""
    name = s.family
    if s.value == "down":
        return ["0" if t > down_from else "1" for t in times]
    as_int = is_int(s.value)
    base = float(s.value)
    noise = NOISE.get(name)
    if name in GROWS:
        gauge, per = GROWS[name]
        rate = rates.get(gauge, 0.0) * per
        step = times[1] - times[0] if len(times) > 1 else 15
        v0 = base - rate * step * len(times)
        out, v = [], max(v0, 0.0)
        for _ in times:
            v += rate * step * (1 + 0.05 * (rng.random() - 0.5))
            out.append(fmt(v, as_int))
        return out
    if noise is None or (base == 0 and noise[0] != "uniform"):
        return [s.value] * len(times)
    phase, period = rng.random() * 6.283, 600 + rng.random() * 1800
    out = []
    for t in times:
        if noise[0] == "uniform":
            v = noise[1] + (noise[2] - noise[1]) * rng.random()
        else:
            wobble = 0.6 * math.sin(6.283 * t / period + phase) + 0.4 * (2 * rng.random() - 1)
            amp = noise[1] if noise[0] == "abs" else noise[1] * base
            v = min(max(base + amp * wobble, noise[2]), noise[3])
        out.append(fmt(v, as_int))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the OpenMetrics file to write")
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--minutes", type=int, default=60)
    p.add_argument("--step", type=int, default=15, help="seconds between scrapes")
    p.add_argument("--end", type=int, default=None, help="unix seconds of the last scrape (now)")
    p.add_argument("--down-minutes", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    started = time.monotonic()
    end = args.end if args.end is not None else int(time.time())
    args.end = end - end % args.step
    first = args.end - args.minutes * 60 + args.step
    times = list(range(first, args.end + 1, args.step))
    fam_order, fam_meta, series, facts = build(args)
    down_from = args.end - args.down_minutes * 60
    rng = random.Random(args.seed)
    # Counters follow the mean of their gauge on the same GPU; the template value is their end.
    rates_by_gpu = {}
    for name in {g for g, _ in GROWS.values()}:
        for node, s in series.get(name, []):
            key = (name, node, s.prefix[s.prefix.index("{"):].split("instance")[0])
            rates_by_gpu[key] = float(s.value)
    n_series = n_samples = 0
    times_until = {}
    with open(args.out, "w") as f:
        for name in fam_order:
            meta, members = fam_meta[name], series[name]
            if not members:
                continue
            if "help" in meta:
                f.write(f"# HELP {name} {meta['help']}\n")
            f.write(f"# TYPE {name} {meta['type']}\n")
            for node, s in members:
                rates = {}
                if name in GROWS:
                    gauge = GROWS[name][0]
                    key = (gauge, node, s.prefix[s.prefix.index("{"):].split("instance")[0])
                    rates[gauge] = rates_by_gpu.get(key, 0.0)
                ts = times_until.setdefault(s.until, [t for t in times if t <= s.until])
                values = samples(s, ts, rng, rates, down_from)
                f.write("".join(f"{s.prefix}{v} {t}\n" for v, t in zip(values, ts)))
                n_series += 1
                n_samples += len(ts)
        f.write("# EOF\n")
    kinds = facts["kinds"]
    print(
        f"{args.out}: {n_series} series, {n_samples} samples, "
        f"{pathlib.Path(args.out).stat().st_size / 1e6:.0f} MB in {time.monotonic() - started:.1f} s; "
        f"{kinds.count('gpudiag')} gpudiag + {kinds.count('dcgm')} dcgm-exporter nodes, "
        f"{len(kinds) * GPUS} GPUs, {len(facts['jobs'])} Slurm jobs, "
        f"straggler {facts['straggler']} in job {facts['straggler_job']}, "
        f"down {['node-%03d' % d for d in facts['down']]}, "
        f"faults {sorted(('node-%03d' % k[0], k[1], v) for k, v in facts['faults'].items())}; "
        f"first {first} end {args.end}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
