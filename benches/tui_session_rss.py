#!/usr/bin/env python3
"""Resident memory of the terminal UI as a session grows, without a GPU: `gpudiag replay` of a
long recording at 64x speed in a 120x36 pty (256 ticks a second from samples 250 ms apart), with
VmRSS and VmHWM read from /proc at 20 s, 40 s and the end. What grows is what the UI keeps per
tick: the session kept for "save a recording" (`w`, at most 20,000 ticks) and the history.

    python3 benches/tui_session_rss.py BINARY [BINARY ...] [--seconds 75]

The recording (about 23,000 samples of tests/fixtures/recordings/healthy.ndjson with their times
moved on, as benches/replay_rss.py writes them) is made once under /tmp.
"""
import argparse
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import replay_rss  # noqa: E402

RECORDING = "/tmp/gpudiag-tui-session-rss.ndjson"


def status_mb(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def run(binary, seconds):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    proc = subprocess.Popen([binary, "replay", RECORDING, "--speed", "64"], stdin=slave,
                            stdout=slave, stderr=slave, start_new_session=True,
                            env=dict(os.environ, TERM="xterm-256color"))
    os.close(slave)

    def drain():
        while True:
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    started = time.time()
    points = []
    for at in (20, 40, seconds):
        time.sleep(max(0.0, started + at - time.time()))
        st = status_mb(proc.pid)
        points.append(f"{st['VmRSS']:.1f} / {st['VmHWM']:.1f}")
    os.write(master, b"q")
    proc.wait(timeout=10)
    print(f"| `{binary}` | " + " | ".join(points) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--seconds", type=float, default=75.0)
    args = ap.parse_args()
    if not os.path.exists(RECORDING):
        replay_rss.write_plain(RECORDING, 30_000_000)
    print(f"| binary | RSS / peak (MB) at 20 s | at 40 s | at {args.seconds:.0f} s |")
    print("|---|---|---|---|")
    for b in args.binaries:
        run(b, args.seconds)


if __name__ == "__main__":
    main()
