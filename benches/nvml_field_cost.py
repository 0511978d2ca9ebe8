#!/usr/bin/env python3
"""Cost of one nvmlDeviceGetFieldValues call on GPU 0 (pynvml): the twelve counters gpudiag reads
on every poll, with and without the five clock-event duration fields, and those five alone.
Usage on a GPU host: python3 benches/nvml_field_cost.py"""
import time

import pynvml as n

n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
names = [x for x in dir(n) if x.startswith("NVML_FI_DEV_CLOCKS_EVENT_REASON")]
print({x: getattr(n, x) for x in names})
base = [n.NVML_FI_DEV_MEMORY_TEMP, n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        n.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, n.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, n.NVML_FI_DEV_RETIRED_SBE,
        n.NVML_FI_DEV_RETIRED_DBE, n.NVML_FI_DEV_RETIRED_PENDING, n.NVML_FI_DEV_REMAPPED_COR,
        n.NVML_FI_DEV_REMAPPED_UNC, n.NVML_FI_DEV_REMAPPED_PENDING, n.NVML_FI_DEV_REMAPPED_FAILURE]
# The ids nvml-wrapper sends for the five durations, and the 251-255 block of older headers.
for ids_name, extra in [("74,76,251,252,253", [74, 76, 251, 252, 253]),
                        ("251-255", [251, 252, 253, 254, 255])]:
    for label, ids in [("base 12", base), ("base+5 " + ids_name, base + extra),
                       ("5 only " + ids_name, extra)]:
        n.nvmlDeviceGetFieldValues(h, ids)
        t = time.perf_counter()
        runs = 300
        for _ in range(runs):
            v = n.nvmlDeviceGetFieldValues(h, ids)
        dt = (time.perf_counter() - t) / runs * 1e6
        print(f"{label:30s} {dt:8.1f} us/call  statuses={[x.nvmlReturn for x in v][-5:]}")
t = time.perf_counter()
for _ in range(300):
    n.nvmlDeviceGetUtilizationRates(h)
print("utilization", (time.perf_counter() - t) / 300 * 1e6, "us")
