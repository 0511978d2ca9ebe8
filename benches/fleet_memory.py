#!/usr/bin/env python3
"""Peak resident memory of one `gpudiag fleet --json` against a fake Prometheus on loopback that
serves crafted answers (issue 39, item 9): how much a hostile or huge Prometheus answer makes
the fleet hold.

    python3 benches/fleet_memory.py --gpudiag target/release/gpudiag [CASE ...]

Cases (all by default):
  cap      every instant query answers a vector of --answer-mib MiB of series that carry only
           labels the fleet keeps (the four core reads are asked at once)
  tiny     the same size of the smallest series that keep a label: the most series per byte
  alerts   one GPU and --alerts firing alerts on it (200,000 by default)
  fleet    a real-looking fleet of --gpus GPUs (8 a node), gpudiag's and dcgm-exporter's
           series, to see what a large fleet that must still be read costs

Prints one Markdown row per case: exit code, peak RSS of the child (os.wait4), wall time, the
document's size, and what the document says was left out (its `left_out`, or its
`could_not_run` line). Each case's fake Prometheus is a process of its own, so the measuring
process stays small: Linux counts a parent's resident set into its child's peak at exec (this
script's, about 10 MiB, is in every figure).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
RULES = b'{"status":"success","data":{"groups":[]}}'
NO_ALERTS = b'{"status":"success","data":{"alerts":[]}}'


def vector(items):
    return b'{"status":"success","data":{"resultType":"vector","result":[' + b",".join(items) + b"]}}"


def series(labels, value="50"):
    return json.dumps({"metric": labels, "value": [1, value]}, separators=(",", ":")).encode()


def to_size(make, mib):
    """Items from make(i) until the answer holds `mib` MiB."""
    out, size, i, limit = [], 0, 0, int(mib * (1 << 20)) - 200
    while True:
        item = make(i)
        if size + len(item) + 1 > limit:
            return vector(out)
        out.append(item)
        size += len(item) + 1
        i += 1


def cap_answer(mib):
    return to_size(lambda i: series({
        "__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": f"node-{i // 8:06d}",
        "UUID": f"GPU-{i:012d}", "gpu": str(i % 8), "instance": f"node-{i // 8:06d}:9835",
        "job": "gpudiag"}), mib)


def tiny_answer(mib):
    return to_size(lambda i: series({"gpu": str(i)}, "1"), mib)


def one_gpu():
    return vector([series({"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node-0",
                           "UUID": "GPU-0", "gpu": "0", "instance": "node-0:9835",
                           "job": "gpudiag"})])


def alerts_answer(n):
    items = []
    for i in range(n):
        items.append(json.dumps({
            "labels": {"alertname": f"GpuSomething{i % 50}", "severity": "warn" if i % 3 else "critical",
                       "Hostname": "node-0", "UUID": "GPU-0", "gpu": "0", "instance": "node-0:9835",
                       "job": "gpudiag", "rule": f"r{i}"},
            "annotations": {"summary": f"alert {i} on GPU 0 of node-0",
                            "description": "not read"},
            "state": "firing", "activeAt": "2026-11-27T10:00:00Z", "value": "1e+00"},
            separators=(",", ":")).encode())
    return b'{"status":"success","data":{"alerts":[' + b",".join(items) + b"]}}"


def fleet_answers(gpus):
    """Device series (gpudiag's and dcgm-exporter's) and gpudiag's own, 8 GPUs a node."""
    device, own = [], []
    for i in range(gpus):
        node = f"gpu-node-{i // 8:04d}"
        base = {"Hostname": node, "UUID": f"GPU-{i:08x}-9b4e-5d06-a1c2-7e9f0b4d2a11", "gpu": str(i % 8),
                "modelName": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{i % 8:02X}:00.0",
                "device": f"nvidia{i % 8}", "DCGM_FI_DRIVER_VERSION": "580.159.04"}
        for job, port in (("gpudiag", 9835), ("dcgm-exporter", 9400)):
            for name, v in (("DCGM_FI_DEV_GPU_UTIL", "97"), ("DCGM_FI_PROF_SM_ACTIVE", "0.6"),
                            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.3"), ("DCGM_FI_DEV_FB_USED", "40000"),
                            ("DCGM_FI_DEV_FB_FREE", "41000"), ("DCGM_FI_DEV_FB_RESERVED", "500"),
                            ("DCGM_FI_DEV_POWER_USAGE", "600"), ("DCGM_FI_DEV_GPU_TEMP", "60")):
                device.append(series(dict(base, __name__=name, instance=f"{node}:{port}", job=job), v))
        g = dict(base, instance=f"{node}:9835", job="gpudiag")
        own.append(series(dict(g, __name__="gpudiag_verdict", verdict="compute_bound",
                               confidence="high", basis="window"), "1"))
        own.append(series(dict(g, __name__="gpudiag_verdict_judged"), "1"))
        own.append(series(dict(g, __name__="gpudiag_finding", id="throttle.power_cap",
                               severity="info"), "1"))
        own.append(series(dict(g, __name__="gpudiag_gpu_job_info", job_key=str(4000 + i // 64),
                               joined_by="slurm_job", slurm_job=str(4000 + i // 64),
                               rank=str(i % 64)), "1"))
    nodes = sorted({f"gpu-node-{i // 8:04d}" for i in range(gpus)})
    ups = [series({"__name__": "up", "instance": f"{n}:{p}", "job": j}, "1")
           for n in nodes for j, p in (("gpudiag", 9835), ("dcgm-exporter", 9400))]
    for n in nodes:
        own.append(series({"__name__": "gpudiag_info", "Hostname": n, "instance": f"{n}:9835",
                           "job": "gpudiag", "version": "0.9.0"}, "1"))
    stamps = [s.replace(b'"1"]', b'"1764240000"]') for s in ups]
    return vector(device), vector(own), vector(ups), vector(stamps)


class Fake(BaseHTTPRequestHandler):
    answers = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        a = self.answers
        if self.path.startswith("/api/v1/alerts"):
            body = a.get("alerts", NO_ALERTS)
        elif self.path.startswith("/api/v1/rules"):
            body = RULES
        elif self.path.startswith("/api/v1/query"):
            from urllib.parse import parse_qs, urlparse
            q = parse_qs(urlparse(self.path).query).get("query", [""])[0]
            if "everything" in a:
                body = a["everything"]
            elif "timestamp(" in q:
                body = a.get("stamps", EMPTY)
            elif q.startswith("up") or q.startswith('{__name__=~"up"'):
                body = a.get("up", EMPTY)
            elif "DCGM_FI_DEV_GPU_UTIL" in q:
                body = a.get("device", EMPTY)
            elif "gpudiag_info" in q:
                body = a.get("own", EMPTY)
            else:
                body = EMPTY
        else:
            body = b"not found"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


def run(gpudiag, url):
    start = time.perf_counter()
    proc = subprocess.Popen([gpudiag, "fleet", "--json", "--prometheus", url, "--query-timeout", "60s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = bytearray()
    reader = threading.Thread(target=lambda: out.extend(proc.stdout.read()))
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    reader.join()
    wall = time.perf_counter() - start
    note = ""
    try:
        doc = json.loads(out)
        if doc.get("could_not_run"):
            note = doc["could_not_run"][:120]
        else:
            note = f"{doc['counts']['gpus']} GPUs; left out: {json.dumps(doc.get('left_out'))}"
    except (ValueError, KeyError):
        note = proc.stderr.read().decode(errors="replace")[:120]
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024, wall, len(out), note


def serve(case, args):
    """Serves one case's answers on a free loopback port, printed on stdout; runs until killed.
    A process of its own: a child's peak RSS counts its parent's resident set at exec, and
    these answers are hundreds of MB."""
    if case == "cap":
        Fake.answers = {"everything": cap_answer(args.answer_mib)}
    elif case == "tiny":
        Fake.answers = {"everything": tiny_answer(args.answer_mib)}
    elif case == "alerts":
        Fake.answers = {"device": one_gpu(), "alerts": alerts_answer(args.alerts)}
    elif case == "fleet":
        d, o, u, s = fleet_answers(args.gpus)
        Fake.answers = {"device": d, "own": o, "up": u, "stamps": s}
    else:
        sys.exit(f"unknown case {case}")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpudiag", required=True)
    ap.add_argument("--answer-mib", type=float, default=63.9)
    ap.add_argument("--alerts", type=int, default=200_000)
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("cases", nargs="*", default=["cap", "tiny", "alerts", "fleet"])
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args)
    what = {
        "cap": f"cap: every answer {args.answer_mib} MiB",
        "tiny": f"tiny: every answer {args.answer_mib} MiB of one-label series",
        "alerts": f"alerts: {args.alerts} firing on one GPU",
        "fleet": f"fleet: {args.gpus} GPUs, gpudiag and dcgm-exporter",
    }
    print("| case | exit | peak RSS (MiB) | wall (s) | document (bytes) | what it says |")
    print("|---|---|---|---|---|---|")
    for case in args.cases:
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", case, "--answer-mib", str(args.answer_mib),
             "--alerts", str(args.alerts), "--gpus", str(args.gpus), "--gpudiag", args.gpudiag],
            stdout=subprocess.PIPE)
        try:
            port = int(server.stdout.readline())
            code, rss, wall, size, note = run(args.gpudiag, f"http://127.0.0.1:{port}")
        finally:
            server.kill()
            server.wait()
        print(f"| {what[case]} | {code} | {rss:.0f} | {wall:.1f} | {size} | {note} |", flush=True)


if __name__ == "__main__":
    main()
