#!/usr/bin/env python3
"""`gpudiag serve` under load on loopback: scrape latency and throughput with many concurrent
clients, then good-scrape latency while silent and malformed clients abuse the server.

    python3 benches/serve_load.py --gpudiag target/release/gpudiag [--seconds 10]

Prints one line per phase; benches/RESULTS.md keeps the figures.
"""
import argparse, socket, statistics, subprocess, threading, time


def scrape(addr):
    t = time.perf_counter()
    with socket.create_connection(addr, timeout=30) as c:
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return time.perf_counter() - t, out.split(b" ", 2)[1] if out else b"closed"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpudiag", default="target/release/gpudiag")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", type=int, default=64)
    a = ap.parse_args()
    p = subprocess.Popen([a.gpudiag, "serve", "--listen", "127.0.0.1:0", "--demo"],
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        host, port = line.split("http://")[1].split("/")[0].rsplit(":", 1)
        addr = (host, int(port))
        # The first sample arrives within a tick of the start.
        time.sleep(1)

        # Phase 1: concurrent scrapes only.
        lat, codes, stop = [], {}, time.time() + a.seconds
        lock = threading.Lock()

        def client():
            while time.time() < stop:
                dt, code = scrape(addr)
                with lock:
                    lat.append(dt)
                    codes[code] = codes.get(code, 0) + 1
        ts = [threading.Thread(target=client) for _ in range(a.clients)]
        t0 = time.time()
        [t.start() for t in ts]
        [t.join() for t in ts]
        el = time.time() - t0
        print(f"{a.clients} concurrent clients, {el:.1f} s: {len(lat)} scrapes ({len(lat)/el:.0f}/s), "
              f"p50 {pct(lat, 50):.2f} ms, p99 {pct(lat, 99):.2f} ms, max {max(lat)*1000:.1f} ms, codes {codes}")

        # Phase 2: 320 silent clients reconnecting as they are closed, 8 garbage senders,
        # and one good scraper every 100 ms.
        stop = time.time() + a.seconds
        closed = [0]

        def silent():
            while time.time() < stop:
                try:
                    with socket.create_connection(addr, timeout=1) as c:
                        while time.time() < stop and c.recv(4096):
                            pass
                except OSError:
                    pass
                with lock:
                    closed[0] += 1
                time.sleep(0.02)

        def garbage():
            while time.time() < stop:
                try:
                    with socket.create_connection(addr, timeout=5) as c:
                        c.sendall(b"\x00\x01garbage\r\n\r\n")
                        while c.recv(4096):
                            pass
                except OSError:
                    pass
        abusers = [threading.Thread(target=silent) for _ in range(320)] + \
                  [threading.Thread(target=garbage) for _ in range(8)]
        [t.start() for t in abusers]
        good, gcodes = [], {}
        while time.time() < stop:
            dt, code = scrape(addr)
            good.append(dt)
            gcodes[code] = gcodes.get(code, 0) + 1
            time.sleep(0.1)
        [t.join() for t in abusers]
        print(f"under abuse (320 silent + 8 garbage clients), {a.seconds:.0f} s: {len(good)} good scrapes, "
              f"p50 {pct(good, 50):.2f} ms, p99 {pct(good, 99):.2f} ms, max {max(good)*1000:.1f} ms, "
              f"codes {gcodes}; silent connections closed by the server: {closed[0]}")
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
