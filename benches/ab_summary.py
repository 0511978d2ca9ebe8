#!/usr/bin/env python3
"""Medians of benches/ab.sh's runs: every number in every Markdown table row a benchmark prints,
by (benchmark, row, column), for the base and the new side, and new / base.

    python3 benches/ab_summary.py OUTDIR
"""
import collections
import pathlib
import re
import statistics
import sys

NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
# A measure on a line of its own: "stats 60 s (raw)   5105 ns/call", "ingest 81.3 µs".
TIMING = re.compile(r"([A-Za-z_][^:,]*?)\s+(\d+(?:\.\d+)?) ?(ns/call|µs|ms)\b")


def tables(text):
    """(row label, column header, value) for each numeric cell of each Markdown table."""
    header = None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue
        for column, cell in zip(header[1:], cells[1:]):
            if NUMBER.match(cell):
                yield cells[0], column, float(cell)


def timings(text):
    """(measure, unit, value) for each timing written outside a table."""
    for line in text.splitlines():
        if line.strip().startswith("|"):
            continue
        for m in TIMING.finditer(line):
            yield m.group(1).strip(), m.group(3), float(m.group(2))


def main():
    out = pathlib.Path(sys.argv[1])
    values = collections.defaultdict(list)
    for path in sorted(out.glob("*.txt")):
        side, bench, _round, _ = path.name.split(".")
        text = path.read_text()
        for row, column, value in tables(text):
            values[(bench, row, column, side)].append(value)
        for measure, unit, value in timings(text):
            values[(bench, measure, unit, side)].append(value)
    keys = sorted({k[:3] for k in values})
    print("| bench | measure | column | base (median) | new (median) | new / base | runs |")
    print("|---|---|---|---|---|---|---|")
    for bench, row, column in keys:
        base = values.get((bench, row, column, "base"), [])
        new = values.get((bench, row, column, "new"), [])
        if not base or not new:
            continue
        b, n = statistics.median(base), statistics.median(new)
        ratio = f"{n / b:.3f}" if b else "n/a"
        print(f"| {bench} | {row} | {column} | {b:g} | {n:g} | {ratio} | {len(base)}+{len(new)} |")


if __name__ == "__main__":
    main()
