#!/usr/bin/env python3
"""What two builds conclude about the same recordings: `check --json` of each fixture recording
(and any recordings named on the command line) by the base and the new binary, compared as sets
of (finding id, device, severity) and the verdict per GPU. Prints one line per recording that
differs, with what each side has that the other lacks.

    python3 benches/findings_ab.py BASE_BINARY NEW_BINARY [RECORDING ...]

benches/ab.sh leaves both binaries in target/ab/bin/{base,new}/gpudiag."""
import glob
import json
import subprocess
import sys


def conclusions(binary, recording):
    out = subprocess.run(
        [binary, "--config", "/dev/null", "check", "--json", "--replay", recording],
        capture_output=True, text=True, check=False)
    report = json.loads(out.stdout)
    findings = set()
    for d in report.get("devices", []):
        for f in d.get("findings", []):
            findings.add((f["id"], f.get("device"), f["severity"]))
    for f in report.get("host_findings", []):
        findings.add((f["id"], f.get("device"), f["severity"]))
    verdicts = {d["info"]["index"]: (d["verdict"] or {}).get("bottleneck")
                for d in report.get("devices", [])}
    return findings, verdicts, report.get("status")


def main():
    base, new = sys.argv[1], sys.argv[2]
    recordings = sys.argv[3:] or sorted(
        glob.glob("tests/fixtures/recordings/*.ndjson")
        + glob.glob("tests/fixtures/workloads/*.ndjson.gz"))
    same = 0
    for r in recordings:
        bf, bv, bs = conclusions(base, r)
        nf, nv, ns = conclusions(new, r)
        if (bf, bv, bs) == (nf, nv, ns):
            same += 1
            continue
        print(f"{r}: only base {sorted(bf - nf)}; only new {sorted(nf - bf)}; "
              f"verdicts {bv} -> {nv}; status {bs} -> {ns}")
    print(f"{same} of {len(recordings)} recordings: the same findings, verdicts and status")


if __name__ == "__main__":
    main()
