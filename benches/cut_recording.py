#!/usr/bin/env python3
"""Cuts a recording to a span of its time, for a fixture small enough to keep in the repository.

    python3 benches/cut_recording.py SRC DST FROM_S TO_S

Keeps the header and every record (sample, event, finding, ...) whose `time_ms` lies in
[first + FROM_S, first + TO_S], `first` being the recording's first sample; records without a
time are kept. Writes DST gzip-compressed when it ends in .gz (the header time fixed at 0, so a
cut made again is the same file). A `.truth.json` beside SRC is copied beside DST with
`cut_from_s` added (its times are ms since the epoch, so they hold). Standard library only.
"""
import gzip
import json
import os
import sys


def open_text(path):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt") if gz else open(path)


def truth_path(recording):
    name = os.path.basename(recording)
    for ext in (".ndjson.gz", ".ndjson"):
        if name.endswith(ext):
            return os.path.join(os.path.dirname(recording), name[: -len(ext)] + ".truth.json")
    return None


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    src, dst, lo_s, hi_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    with open_text(src) as f:
        lines = f.read().splitlines()
    header, records = lines[0], lines[1:]
    parsed = []
    for line in records:
        try:
            parsed.append((json.loads(line), line))
        except json.JSONDecodeError:
            continue  # a cut-off last line
    times = [r.get("time_ms") for r, _ in parsed if r.get("kind") == "sample"]
    if not times:
        sys.exit(f"{src}: no sample")
    first = min(times)
    lo, hi = first + lo_s * 1000, first + hi_s * 1000
    kept = [header] + [
        line for r, line in parsed if r.get("time_ms") is None or lo <= r["time_ms"] <= hi
    ]
    data = ("\n".join(kept) + "\n").encode()
    if dst.endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    with open(dst, "wb") as f:
        f.write(data)
    src_truth, dst_truth = truth_path(src), truth_path(dst)
    if src_truth and dst_truth and os.path.exists(src_truth):
        with open(src_truth) as f:
            truth = json.load(f)
        truth["cut_from_s"] = lo_s
        with open(dst_truth, "w") as f:
            json.dump(truth, f, indent=1)
            f.write("\n")
    print(f"{dst}: {len(kept) - 1} of {len(parsed)} records, {len(data)} bytes")


if __name__ == "__main__":
    main()
