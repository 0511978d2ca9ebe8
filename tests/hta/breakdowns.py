#!/usr/bin/env python3
"""Loads every trace in TRACE_DIR with HolisticTraceAnalysis and runs its temporal and
idle-time breakdowns; prints them as one line, `BREAKDOWNS {"temporal": [...], "idle": [...]}`
(records of HTA's data frames), for tests/profiler_merge.rs.

    python3 tests/hta/breakdowns.py TRACE_DIR"""
import json
import sys

from hta.trace_analysis import TraceAnalysis


def records(df):
    return json.loads(df.to_json(orient="records"))


def main():
    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    temporal = analysis.get_temporal_breakdown(visualize=False)
    idle = analysis.get_idle_time_breakdown(visualize=False)
    # get_idle_time_breakdown returns (breakdown, stats or None).
    if isinstance(idle, tuple):
        idle = idle[0]
    print("BREAKDOWNS " + json.dumps({"temporal": records(temporal), "idle": records(idle)},
                                     sort_keys=True))


if __name__ == "__main__":
    main()
