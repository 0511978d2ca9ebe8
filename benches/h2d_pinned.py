#!/usr/bin/env python3
"""Pinned host-to-device bandwidth, side by side in one run: PyTorch the nvbandwidth way and
`gpudiag probe bandwidth` with each suite, with the host buffer where the probe used to put it
(wherever the thread ran: `GPUDIAG_PROBE_HOST_PLACEMENT=inherit`) and where it puts it now (on
the GPU's CPUs, so on its NUMA node), and a host-copy size sweep (pinned tests only: `GPUDIAG_PROBE_HOST_BYTES`,
`GPUDIAG_PROBE_BANDWIDTH_TESTS`).

Run from the repository root on the GPU host (about 3 minutes with the defaults):

    python3 benches/h2d_pinned.py --gpudiag .gpu-bundle/gpudiag [--device 0] [--rounds 3] [--no-sweep]
        [--local-only]

`--local-only` leaves out the old placement (on a host of one NUMA node both are the same).

PyTorch: a pinned tensor (`pin_memory()`, cudaHostAlloc) and a device tensor of the same size,
`copy_(non_blocking=True)`, 4 warm-ups, then samples of 16 copies between two CUDA events, the
median of 5 samples; GB = 1e9. Each PyTorch measurement runs in a child process of its own, once
where the scheduler puts it (what a user gets) and once kept on the GPU's CPUs; the child reads
/proc/self/numa_maps to say on which NUMA node the pinned pages landed. gpudiag runs never
overlap PyTorch's (its context is gone before gpudiag starts), and every configuration runs in
each round, interleaved (every other round in the reverse order), so a drift of the host touches
them all alike. Prints a Markdown table (median over rounds, min and max), then each suite's
figure over PyTorch's at the same host-copy size *in the same round* (paired: a drift between
rounds, which moved PyTorch's own figure by 3-4 GB/s on one host, cancels), and writes the raw
figures to $OUT/h2d_pinned.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MIB = 1 << 20


def gpu_locality(bus_id):
    """The GPU's NUMA node and CPU list from sysfs (bus id as NVML or torch spell it)."""
    parts = bus_id.lower().split(":")
    if len(parts) == 3 and len(parts[0]) == 8:
        parts[0] = parts[0][-4:]
    d = "/sys/bus/pci/devices/" + ":".join(parts)
    out = {"sysfs": d}
    for name in ("numa_node", "local_cpulist"):
        try:
            with open(os.path.join(d, name)) as f:
                out[name] = f.read().strip()
        except OSError as e:
            out[name] = f"unreadable: {e}"
    return out


def parse_cpulist(text):
    cpus = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            cpus.add(int(part))
    return cpus


def numa_pages_of(size):
    """Per-node pages of the mapping(s) of about `size` resident bytes in /proc/self/numa_maps."""
    found = []
    try:
        with open("/proc/self/numa_maps") as f:
            for line in f:
                nodes = {}
                for tok in line.split():
                    if tok.startswith("N") and "=" in tok and tok[1:].split("=")[0].isdigit():
                        k, v = tok[1:].split("=")
                        nodes[int(k)] = int(v)
                page = 4096
                for tok in line.split():
                    if tok.startswith("kernelpagesize_kB="):
                        page = int(tok.split("=")[1]) * 1024
                # The pinned buffer is resident in full; larger mappings are someone else's.
                if 0.9 * size <= sum(nodes.values()) * page <= 1.1 * size:
                    found.append({f"N{k}": v for k, v in sorted(nodes.items())})
    except OSError as e:
        return f"unreadable: {e}"
    return found


def torch_child(sizes, local_cpus):
    """Runs in a child: PyTorch's pinned H2D and D2H at each size; prints one JSON line."""
    if local_cpus:
        allowed = parse_cpulist(local_cpus) & os.sched_getaffinity(0)
        if allowed:
            os.sched_setaffinity(0, allowed)
    import torch

    def timed(op, samples=5, copies=16, warm=4):
        for _ in range(warm):
            op()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(samples):
            s.record()
            for _ in range(copies):
                op()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e))
        return statistics.median(out)

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cpus": sorted(os.sched_getaffinity(0))[:4]}
    for size in sizes:
        a = torch.empty(size, dtype=torch.uint8, device="cuda").fill_(0x5A)
        h = torch.empty(size, dtype=torch.uint8).pin_memory().fill_(0x5A)
        res[f"h2d_{size}"] = size * 16 / timed(lambda: a.copy_(h, non_blocking=True)) / 1e6
        res[f"d2h_{size}"] = size * 16 / timed(lambda: h.copy_(a, non_blocking=True)) / 1e6
        res[f"numa_{size}"] = numa_pages_of(size)
        del a, h
        torch.cuda.synchronize()
    print(json.dumps(res))


def run_torch(sizes, device, local_cpus):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(device), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-child",
           ",".join(map(str, sizes))] + (["--local-cpus", local_cpus] if local_cpus else [])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": out.stderr[-500:]}


def run_gpudiag(binary, suite, device, inherit, host_bytes=None):
    env = dict(os.environ)
    env.pop("GPUDIAG_PROBE_HOST_PLACEMENT", None)
    env.pop("GPUDIAG_PROBE_HOST_BYTES", None)
    env.pop("GPUDIAG_PROBE_BANDWIDTH_TESTS", None)
    if host_bytes:
        # A sweep times the pinned copies only (the first tests a suite runs, so what the
        # suite's other tests do cannot touch them).
        env["GPUDIAG_PROBE_BANDWIDTH_TESTS"] = "h2d_pinned,d2h_pinned"
    if inherit:
        env["GPUDIAG_PROBE_HOST_PLACEMENT"] = "inherit"
    if host_bytes:
        env["GPUDIAG_PROBE_HOST_BYTES"] = str(host_bytes)
    t = time.time()
    out = subprocess.run([binary, "probe", "bandwidth", "--suite", suite, "--json",
                          "--device", str(device)], capture_output=True, text=True, env=env,
                         timeout=300)
    r = {"wall_s": time.time() - t, "exit": out.returncode}
    try:
        res = json.loads(out.stdout)["devices"][0]["results"][0]
    except (ValueError, KeyError, IndexError):
        r["error"] = (out.stderr or out.stdout)[-500:]
        return r
    for m in res.get("metrics", []):
        r[m["name"]] = m["value"]
    r["params"] = res.get("parameters", {})
    r["verdict"] = res.get("verdict")
    return r


def summary(values):
    v = [x for x in values if isinstance(x, (int, float))]
    if not v:
        return "n/a", None
    return f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})", statistics.median(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpudiag", default=os.environ.get("GPUDIAG_BIN", ".gpu-bundle/gpudiag"))
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--local-only", action="store_true")
    ap.add_argument("--torch-child")
    ap.add_argument("--local-cpus")
    args = ap.parse_args()
    if args.torch_child:
        torch_child([int(x) for x in args.torch_child.split(",")], args.local_cpus)
        return

    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(args.device)
    bus = pynvml.nvmlDeviceGetPciInfo(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    name = pynvml.nvmlDeviceGetName(h)
    name = name.decode() if isinstance(name, bytes) else name
    gen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
    width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
    drv = pynvml.nvmlSystemGetDriverVersion()
    drv = drv.decode() if isinstance(drv, bytes) else drv
    pynvml.nvmlShutdown()
    loc = gpu_locality(bus)
    try:
        with open("/sys/devices/system/node/online") as f:
            nodes = f.read().strip()
    except OSError:
        nodes = "unknown"
    local = loc.get("local_cpulist", "")
    local_ok = local and not local.startswith("unreadable")
    print(f"GPU {args.device}: {name}, {bus}, PCIe Gen{gen} x{width}, driver {drv}; NUMA nodes "
          f"online {nodes}; the GPU's node {loc.get('numa_node')}, its CPUs {local}; this "
          f"process may run on {len(os.sched_getaffinity(0))} CPUs; {os.cpu_count()} CPUs in all",
          flush=True)

    # PyTorch at the suites' host-copy sizes (quick 16 MiB, standard 256 MiB) and at 1 GiB.
    sizes = [16 * MIB, 256 * MIB, 1024 * MIB]
    configs = [(suite, inherit) for suite in ("quick", "standard", "full")
               for inherit in ((False,) if args.local_only else (True, False))]
    raw = {"torch_default": [], "torch_local": [], "gpudiag": {}}
    started = time.time()
    for rnd in range(args.rounds):
        steps = [("torch_default", None)] + ([("torch_local", None)] if local_ok else []) + \
            [("gpudiag", c) for c in configs]
        if rnd % 2:
            steps.reverse()
        for what, config in steps:
            if what == "torch_default":
                raw["torch_default"].append(run_torch(sizes, args.device, None))
            elif what == "torch_local":
                raw["torch_local"].append(run_torch(sizes, args.device, local))
            else:
                suite, inherit = config
                key = f"{suite}/{'inherit' if inherit else 'gpu_local'}"
                raw["gpudiag"].setdefault(key, []).append(
                    run_gpudiag(args.gpudiag, suite, args.device, inherit))
        print(f"round {rnd + 1}/{args.rounds} done at {time.time() - started:.0f} s", flush=True)
    sweep = {}
    if not args.no_sweep:
        # The standard suite's 1 GiB device buffer lets the host copy be any size up to it.
        for size in [16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB]:
            for inherit in (True, False):
                key = f"{size // MIB} MiB/{'inherit' if inherit else 'gpu_local'}"
                sweep[key] = run_gpudiag(args.gpudiag, "standard", args.device, inherit, size)
        print(f"sweep done at {time.time() - started:.0f} s", flush=True)
    raw["sweep"] = sweep

    print(f"\nPinned copies, GB/s: median over {args.rounds} rounds (min–max); each round's figure "
          "is itself the median of its samples.\n")
    print("| source | host buffer placement | host copy | H2D pinned | D2H pinned | note |")
    print("|---|---|---|---|---|---|")
    for who, rows in (("PyTorch", raw["torch_default"]), ("PyTorch", raw["torch_local"])):
        if not rows:
            continue
        place = "as scheduled" if rows is raw["torch_default"] else "GPU's CPUs (taskset)"
        for size in sizes:
            h2d, _ = summary([r.get(f"h2d_{size}") for r in rows])
            d2h, _ = summary([r.get(f"d2h_{size}") for r in rows])
            numa = "; ".join(json.dumps(r.get(f"numa_{size}")) for r in rows)
            err = next((r["error"][-120:] for r in rows if "error" in r), "")
            print(f"| {who} | {place} | {size // MIB} MiB | {h2d} | {d2h} | pages by node: {numa} {err} |")
    for key, rows in raw["gpudiag"].items():
        suite, place = key.split("/")
        h2d, _ = summary([r.get("h2d_pinned") for r in rows])
        d2h, _ = summary([r.get("d2h_pinned") for r in rows])
        p = rows[-1].get("params", {})
        note = ", ".join(f"{k}={p[k]}" for k in ("host_placement", "gpu_numa_node", "host_cpus",
                                                 "host_placement_why") if k in p)
        err = next((r["error"][-160:] for r in rows if "error" in r), "")
        walls = statistics.median([r["wall_s"] for r in rows])
        print(f"| gpudiag {suite} | {'before: inherited' if place == 'inherit' else 'after: GPU-local'} "
              f"| {p.get('host_bytes', 0) // MIB} MiB | {h2d} | {d2h} | {note}; {walls:.1f} s wall {err} |")
    for key, r in sweep.items():
        size, place = key.split("/")
        h2d, _ = summary([r.get("h2d_pinned")])
        d2h, _ = summary([r.get("d2h_pinned")])
        print(f"| gpudiag standard, sweep | {'before: inherited' if place == 'inherit' else 'after: GPU-local'} "
              f"| {size} | {h2d} | {d2h} | one run {r.get('error', '')[-120:]} |")

    print("\nPaired, H2D pinned: each gpudiag run over PyTorch's figure at the same host-copy size "
          "in the same round (median of the rounds' ratios, min-max, rounds at or above 1.000).\n")
    print("| gpudiag suite | placement | host copy | over PyTorch as scheduled | over PyTorch on the GPU's CPUs | verdict |")
    print("|---|---|---|---|---|---|")
    for key, rows in raw["gpudiag"].items():
        suite, place = key.split("/")
        cells, worst = [], None
        for ref_rows in (raw["torch_default"], raw["torch_local"]):
            ratios = []
            for g, t in zip(rows, ref_rows):
                size = g.get("params", {}).get("host_bytes")
                ref = t.get(f"h2d_{size}")
                if isinstance(g.get("h2d_pinned"), (int, float)) and isinstance(ref, (int, float)):
                    ratios.append(g["h2d_pinned"] / ref)
            if not ratios:
                cells.append("n/a")
                continue
            m = statistics.median(ratios)
            worst = m if worst is None else min(worst, m)
            at_least = sum(r >= 1.0 for r in ratios)
            cells.append(f"{m:.3f} ({min(ratios):.3f}–{max(ratios):.3f}; {at_least} of {len(ratios)} ≥ 1)")
        size = rows[-1].get("params", {}).get("host_bytes", 0) // MIB
        verdict = ("n/a" if worst is None else "at least PyTorch" if worst >= 1.0
                   else "within 0.5%" if worst >= 0.995 else "BELOW")
        print(f"| {suite} | {'before: inherited' if place == 'inherit' else 'after: GPU-local'} "
              f"| {size} MiB | {cells[0]} | {cells[1] if len(cells) > 1 else 'n/a'} | {verdict} |")
    print(f"\ntotal {time.time() - started:.0f} s")
    dest = os.environ.get("OUT", ".")
    with open(os.path.join(dest, "h2d_pinned.json"), "w") as f:
        json.dump({"gpu": name, "bus": bus, "locality": loc, "nodes_online": nodes, **raw}, f,
                  indent=1)


if __name__ == "__main__":
    main()
