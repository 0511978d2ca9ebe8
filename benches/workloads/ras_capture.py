#!/usr/bin/env python3
"""Asks NCCL's RAS service one conversation and keeps the exact bytes it answered, for the
parser's fixtures.

    ras_capture.py OUT_FILE [--addr HOST:PORT] [--deadline S] LINE [LINE ...]

Sends each LINE (with a newline) in turn, reading whatever arrives between them, and reads until
the server closes or the deadline passes. Writes the answer's bytes to OUT_FILE and a line
"sent: ... | bytes: N | closed: yes/no | seconds: S" to OUT_FILE.meta. Only read commands belong
here (CLIENT PROTOCOL, TIMEOUT, STATUS, VERBOSE STATUS, SET FORMAT); never CONTROL.
"""
import argparse
import socket
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--addr", default="127.0.0.1:28028")
    p.add_argument("--deadline", type=float, default=40.0)
    p.add_argument("lines", nargs="+")
    args = p.parse_args()
    for line in args.lines:
        if line.strip().upper().startswith("CONTROL"):
            raise SystemExit("ras_capture: CONTROL is not a read command")
    host, port = args.addr.rsplit(":", 1)
    t0 = time.time()
    got = bytearray()
    closed = False
    error = ""
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        s.settimeout(1.0)

        def drain(seconds):
            nonlocal closed
            end = time.time() + seconds
            while time.time() < end:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    closed = True
                    return
                got.extend(chunk)
                if len(got) > (8 << 20):
                    return

        for line in args.lines:
            s.sendall(line.encode() + b"\n")
            drain(0.5)
            if closed:
                break
        if not closed:
            drain(max(0.0, args.deadline - (time.time() - t0)))
        s.close()
    except OSError as e:
        error = f" | error: {e}"
    with open(args.out, "wb") as f:
        f.write(bytes(got))
    with open(args.out + ".meta", "w") as f:
        f.write(f"sent: {' / '.join(args.lines)} | bytes: {len(got)} | "
                f"closed: {'yes' if closed else 'no'} | seconds: {time.time() - t0:.1f}{error}\n")


if __name__ == "__main__":
    main()
