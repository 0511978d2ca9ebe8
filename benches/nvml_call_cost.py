#!/usr/bin/env python3
"""CPU cost of each NVML call gpudiag makes per tick and per slow round, on GPU 0, through
NVIDIA's own bindings (pynvml): the fast poll's calls one by one, the GPM sample and metrics
(all sixteen at once, then each alone), and the slow counters. Prints µs of CPU per call
(process CPU time, so a call that sleeps in the driver shows little).

    python3 benches/nvml_call_cost.py [RUNS]
"""
import sys
import time

import pynvml as N

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 100


def cost(label, fn, runs=RUNS):
    fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(runs):
        fn()
    cpu, wall = (time.process_time() - c0) / runs * 1e6, (time.perf_counter() - w0) / runs * 1e6
    print(f"| {label} | {cpu:.1f} | {wall:.1f} |")


def main():
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    print("| call | CPU µs per call | wall µs per call |\n|---|---|---|")
    for label, fn in [
        ("device handle by index", lambda: N.nvmlDeviceGetHandleByIndex(0)),
        ("utilization_rates", lambda: N.nvmlDeviceGetUtilizationRates(h)),
        ("memory_info", lambda: N.nvmlDeviceGetMemoryInfo(h)),
        ("power_usage", lambda: N.nvmlDeviceGetPowerUsage(h)),
        ("enforced_power_limit", lambda: N.nvmlDeviceGetEnforcedPowerLimit(h)),
        ("temperature gpu", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)),
        ("clock_info sm", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)),
        ("clock_info mem", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM)),
        ("performance_state", lambda: N.nvmlDeviceGetPerformanceState(h)),
        ("throttle reasons", lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("encoder_utilization", lambda: N.nvmlDeviceGetEncoderUtilization(h)),
        ("decoder_utilization", lambda: N.nvmlDeviceGetDecoderUtilization(h)),
        ("total_energy_consumption", lambda: N.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("current_pcie_link_gen", lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        ("current_pcie_link_width", lambda: N.nvmlDeviceGetCurrPcieLinkWidth(h)),
        ("pcie_replay_counter", lambda: N.nvmlDeviceGetPcieReplayCounter(h)),
        ("compute processes", lambda: N.nvmlDeviceGetComputeRunningProcesses(h)),
    ]:
        try:
            cost(label, fn)
        except N.NVMLError as e:
            print(f"| {label} | error {e} | |")
    metrics = {n: getattr(N, n) for n in dir(N) if n.startswith("NVML_GPM_METRIC_") and n != "NVML_GPM_METRIC_MAX"}
    wanted = ["GRAPHICS_UTIL", "SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "HMMA_TENSOR_UTIL", "IMMA_TENSOR_UTIL",
              "DFMA_TENSOR_UTIL", "DRAM_BW_UTIL", "FP64_UTIL", "FP32_UTIL", "FP16_UTIL", "INTEGER_UTIL",
              "PCIE_RX_PER_SEC", "PCIE_TX_PER_SEC", "NVLINK_TOTAL_RX_PER_SEC", "NVLINK_TOTAL_TX_PER_SEC"]
    ids = [metrics["NVML_GPM_METRIC_" + w] for w in wanted if "NVML_GPM_METRIC_" + w in metrics]
    a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, a)
    time.sleep(0.1)
    N.nvmlGpmSampleGet(h, b)

    def get(metric_ids):
        mg = N.c_nvmlGpmMetricsGet_t()
        mg.version = N.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(metric_ids)
        mg.sample1, mg.sample2 = a, b
        for i, m in enumerate(metric_ids):
            mg.metrics[i].metricId = m
        N.nvmlGpmMetricsGet(mg)

    cost("gpm SampleGet", lambda: N.nvmlGpmSampleGet(h, b))
    cost("gpm SampleAlloc + Free", lambda: N.nvmlGpmSampleFree(N.nvmlGpmSampleAlloc()))
    cost(f"gpm MetricsGet, {len(ids)} metrics", lambda: get(ids))
    for w, m in zip(wanted, ids):
        cost(f"gpm MetricsGet {w} alone", lambda m=m: get([m]), runs=max(10, RUNS // 4))


if __name__ == "__main__":
    main()
