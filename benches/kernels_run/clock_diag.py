"""Where the records after a torch.profiler trace land: run under
`GPUDIAG_KERNELS_VERBOSE=1 gpudiag run --kernels --trace T -- python3 clock_diag.py DIR`, then
`python3 clock_diag.py --read T` prints the matmul kernels' groups as the trace has them."""
import json
import sys
import time

if sys.argv[1] == "--read":
    events = json.load(open(sys.argv[2]))["traceEvents"]
    ks = sorted((e["ts"], e.get("dur", 0)) for e in events
                if e.get("cat") == "kernel" and "gemm" in e.get("name", "").lower()
                or e.get("cat") == "kernel" and "cutlass" in e.get("name", "").lower())
    print("kernels", len(ks))
    group = [ks[0]] if ks else []
    for prev, k in zip(ks, ks[1:]):
        if k[0] - prev[0] > 200_000:
            print("group", len(group), "from", group[0][0], "to", group[-1][0],
                  "mean dur", sum(d for _, d in group) / len(group))
            group = []
        group.append(k)
    if group:
        print("group", len(group), "from", group[0][0], "to", group[-1][0],
              "mean dur", sum(d for _, d in group) / len(group))
    sys.exit(0)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

a = torch.randn(2048, 2048, device="cuda")


def phase(name, n):
    t0, r0 = time.monotonic_ns(), time.time_ns()
    for _ in range(n):
        a @ a
        torch.cuda.synchronize()
    print(name, "monotonic", t0, time.monotonic_ns(), "realtime", r0, time.time_ns(), flush=True)


phase("before", 50)
time.sleep(1.5)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    phase("traced", 20)
prof.export_chrome_trace(sys.argv[1] + "/user.json")
phase("after", 50)
time.sleep(1.5)
phase("after2", 50)
