#!/usr/bin/env python3
"""Does NVML's PCIe throughput read (about 20 ms a call, rx and tx) overlap with other calls?

A single-read `gpudiag check --window 0` reads rx then tx inside its one poll: about 40 ms of its
wall time. This times, on GPU 0 with pynvml, the two calls one after the other, the two on two
threads at once, and the two beside a thread making the fast-field calls a poll makes, so the
way the single read could overlap them is chosen from figures. Usage on the GPU host:

    python3 benches/pcie_throughput_overlap.py [--rounds 20]

Prints medians in ms. "parallel" near 20 ms means rx and tx can be read at once (then check
could save ~20 ms); near 40 ms means NVML serialises them. "fast calls beside" much above
"fast calls alone" means the throughput read holds up other calls on the same GPU.
"""
import argparse
import statistics
import threading
import time

import pynvml


def ms(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    rx = lambda: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    tx = lambda: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES)

    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def fast():
        pynvml.nvmlDeviceGetUtilizationRates(h)
        pynvml.nvmlDeviceGetMemoryInfo(h)
        pynvml.nvmlDeviceGetPowerUsage(h)
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
        pynvml.nvmlDeviceGetPerformanceState(h)
        reasons(h)

    def both_parallel():
        t = threading.Thread(target=tx)
        t.start()
        rx()
        t.join()

    def fast_beside():
        t = threading.Thread(target=lambda: (rx(), tx()))
        t.start()
        time.sleep(0.005)
        took = ms(fast)
        t.join()
        return took

    rows = {"rx alone": [], "tx alone": [], "rx then tx": [], "rx and tx parallel": [],
            "fast calls alone": [], "fast calls beside rx+tx": []}
    for _ in range(args.rounds):
        time.sleep(0.05)
        rows["rx alone"].append(ms(rx))
        time.sleep(0.05)
        rows["tx alone"].append(ms(tx))
        time.sleep(0.05)
        rows["rx then tx"].append(ms(lambda: (rx(), tx())))
        time.sleep(0.05)
        rows["rx and tx parallel"].append(ms(both_parallel))
        time.sleep(0.05)
        rows["fast calls alone"].append(ms(fast))
        time.sleep(0.05)
        rows["fast calls beside rx+tx"].append(fast_beside())
    print("| call | median (ms) | min (ms) | max (ms) |")
    print("|---|---|---|---|")
    for name, v in rows.items():
        print(f"| {name} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} |")
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
