#!/usr/bin/env python3
"""Peak RSS and wall time of `gpudiag check --replay` against the size of the recording.

Generates recordings of the requested sizes (one H200 sample per tick every 250 ms, the lines of
tests/fixtures/recordings/healthy.ndjson with their times moved on), plain, gzip and as a
bug-report bundle, then runs gpudiag on each under /usr/bin/time -v and prints a Markdown table.
A pipe run feeds the plain file through `cat`. Nothing but the scratch directory is written.

    python3 benches/replay_rss.py --gpudiag target/release/gpudiag --sizes 25,100,400 \\
        --bundle-mib 1024

The bundle is the attack from the issue: a few kilobytes of tar.gz whose recording inflates to
--bundle-mib of valid samples. Pass --max-inflated-size through --extra when it is above 4 GiB.
"""

import argparse
import gzip
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests/fixtures/recordings/healthy.ndjson")
STEP_MS = 250


def lines(target_bytes):
    """Yields the header, then sample lines until about `target_bytes` were yielded."""
    with open(FIXTURE) as f:
        fixture = [json.loads(line) for line in f]
    header, samples = fixture[0], fixture[1:]
    yield json.dumps(header, separators=(",", ":")) + "\n"
    written = 0
    t0 = samples[0]["time_ms"]
    i = 0
    while written < target_bytes:
        s = dict(samples[i % len(samples)])
        s["time_ms"] = t0 + i * STEP_MS
        line = json.dumps(s, separators=(",", ":")) + "\n"
        written += len(line)
        i += 1
        yield line


def write_plain(path, size):
    with open(path, "w") as f:
        for line in lines(size):
            f.write(line)


def write_gzip(path, size):
    with gzip.open(path, "wt", compresslevel=6) as f:
        for line in lines(size):
            f.write(line)


def write_bundle(path, size):
    """A tar.gz with one member, recording.ndjson.gz, as `gpudiag report` names it."""
    inner = io.BytesIO()
    with gzip.GzipFile(fileobj=inner, mode="wb", compresslevel=9) as g:
        for line in lines(size):
            g.write(line.encode())
    data = inner.getvalue()
    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo("recording.ndjson.gz")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def measure(command, shell=False):
    """(max RSS in MB, wall seconds, exit code) of `command` under /usr/bin/time -v."""
    timed = ["/usr/bin/time", "-v"] + (["sh", "-c", command] if shell else command)
    start = time.monotonic()
    out = subprocess.run(timed, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - start
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr)
    rss = int(m.group(1)) / 1024 if m else float("nan")
    # /usr/bin/time reports the command's own exit status.
    code = re.search(r"Exit status: (\d+)", out.stderr)
    return rss, wall, int(code.group(1)) if code else out.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpudiag", default=os.path.join(ROOT, "target/release/gpudiag"))
    ap.add_argument("--sizes", default="25,100,400", help="plain recording sizes in MB")
    ap.add_argument("--bundle-mib", type=int, default=1024, help="0 skips the bundle")
    ap.add_argument("--gzip", action="store_true", help="also the largest size as gzip")
    ap.add_argument("--pipe", action="store_true", help="also the largest size through a pipe")
    ap.add_argument("--extra", default="", help="more arguments for gpudiag check")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    extra = args.extra.split()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        for mb in sizes:
            path = os.path.join(tmp, f"rec-{mb}mb.ndjson")
            write_plain(path, mb * 1_000_000)
            cmd = [args.gpudiag, "check", "--json", "--replay", path] + extra
            rows.append((f"plain {mb} MB", os.path.getsize(path)) + measure(cmd))
            if mb == sizes[-1] and args.pipe:
                shell = f"cat {path} | {args.gpudiag} check --json --replay - {' '.join(extra)}"
                rows.append((f"plain {mb} MB, piped", os.path.getsize(path))
                            + measure(shell, shell=True))
            os.remove(path)
        if args.gzip and sizes:
            mb = sizes[-1]
            path = os.path.join(tmp, f"rec-{mb}mb.ndjson.gz")
            write_gzip(path, mb * 1_000_000)
            cmd = [args.gpudiag, "check", "--json", "--replay", path] + extra
            rows.append((f"gzip of {mb} MB", os.path.getsize(path)) + measure(cmd))
            os.remove(path)
        if args.bundle_mib:
            path = os.path.join(tmp, "bundle.tar.gz")
            write_bundle(path, args.bundle_mib << 20)
            cmd = [args.gpudiag, "check", "--json", "--replay", path] + extra
            rows.append((f"bundle inflating to {args.bundle_mib} MiB", os.path.getsize(path))
                        + measure(cmd))
    print("| input | file size (bytes) | peak RSS (MB) | wall (s) | exit code |")
    print("|---|---|---|---|---|")
    for name, size, rss, wall, code in rows:
        print(f"| {name} | {size} | {rss:.1f} | {wall:.1f} | {code} |")


if __name__ == "__main__":
    main()
