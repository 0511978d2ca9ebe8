#!/usr/bin/env python3
"""Tune and check the built-in Hopper matmul kernels without building gpudiag: load the PTX the
probe embeds (kernels/ptx/matmul_sm90a.compute_90a.ptx) through the driver API, run every wgmma
variant on random data at SIZE^3, check each against PyTorch, and time it against PyTorch's
cuBLAS on the same GPU in the same run.

Run on an H100/H200 from the repository root:  python3 benches/builtin_matmul.py [SIZE] [PTX]
Timing mirrors the probe: 2 warm-ups, then the median of 20 products each between CUDA events.
The figure that counts for the issue is the probe's own (`GPUDIAG_DRIVER_ONLY=1 gpudiag probe
matmul` against cuBLASLt through `gpudiag probe matmul`); this script is for trying variants.
"""
import ctypes, statistics, sys

import torch

SIZE = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
PTX = sys.argv[2] if len(sys.argv) > 2 else "kernels/ptx/matmul_sm90a.compute_90a.ptx"
VARIANTS = ["s4r", "s4"]
TILE_J, TILE_I, TILE_K = 128, 256, 64

cuda = ctypes.CDLL("libcuda.so.1")


def ck(rc, what):
    if rc != 0:
        msg = ctypes.c_char_p()
        cuda.cuGetErrorString(rc, ctypes.byref(msg))
        sys.exit(f"{what}: CUDA error {rc} {msg.value.decode() if msg.value else ''}")


class TensorMap:
    """A 64-byte aligned CUtensorMap for a row-major rows x K matrix of 2-byte elements."""

    def __init__(self, ptr, rows, k, box_rows):
        self.raw = (ctypes.c_uint8 * 256)()
        off = (-ctypes.addressof(self.raw)) % 128
        self.addr = ctypes.addressof(self.raw) + off
        dims = (ctypes.c_uint64 * 2)(k, rows)
        strides = (ctypes.c_uint64 * 1)(k * 2)
        box = (ctypes.c_uint32 * 2)(TILE_K, box_rows)
        elem = (ctypes.c_uint32 * 2)(1, 1)
        # data type 1 = UINT16, interleave 0, swizzle 3 = 128B, L2 promotion 2 = 128B, OOB fill 0.
        ck(cuda.cuTensorMapEncodeTiled(ctypes.c_void_p(self.addr), 1, 2, ctypes.c_void_p(ptr), dims, strides,
                                       box, elem, 0, 3, 2, 0), "cuTensorMapEncodeTiled")


def main():
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # make the primary context current
    with open(PTX, "rb") as f:
        image = f.read() + b"\0"
    mod = ctypes.c_void_p()
    ck(cuda.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
    m = n = k = SIZE
    stream = torch.cuda.current_stream().cuda_stream
    print(f"{'kernel':<24} {'TFLOP/s':>9} {'torch':>9} {'ratio':>7} {'max rel err':>12} regs")
    for dtype, ty in [(torch.bfloat16, "bf16"), (torch.float16, "f16")]:
        # Small integers / 64 as in the probe: exact in both types, products exact in fp32.
        a = (torch.randint(-64, 65, (m, k), device="cuda").to(dtype) / 64).contiguous()
        b = (torch.randint(-64, 65, (n, k), device="cuda").to(dtype) / 64).contiguous()
        ref = b.float() @ a.float().T  # C viewed as N x M (column-major M x N)
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(fn):
            for _ in range(2):
                fn()
            out = []
            for _ in range(20):
                ev0.record()
                fn()
                ev1.record()
                ev1.synchronize()
                out.append(2 * m * n * k / (ev0.elapsed_time(ev1) * 1e-3) / 1e12)
            return statistics.median(out)

        torch_tflops = timed(lambda: a @ b.T)
        for v in VARIANTS:
            name = f"wgmma_gemm_{ty}_{v}"
            fn = ctypes.c_void_p()
            ck(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), name)
            stages = int(v[1])
            smem = stages * (TILE_J + TILE_I) * TILE_K * 2 + 1024 + 16 * stages
            ck(cuda.cuFuncSetAttribute(fn, 8, smem), "max dynamic shared")
            regs = ctypes.c_int()
            cuda.cuFuncGetAttribute(ctypes.byref(regs), 4, fn)
            spill = ctypes.c_int()
            cuda.cuFuncGetAttribute(ctypes.byref(spill), 3, fn)
            c = torch.full((n, m), float("nan"), device="cuda")
            map_a, map_b = TensorMap(a.data_ptr(), m, k, TILE_I), TensorMap(b.data_ptr(), n, k, TILE_J)
            pc = ctypes.c_uint64(c.data_ptr())
            mi, ni, ki = ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k)
            params = (ctypes.c_void_p * 6)(map_a.addr, map_b.addr, ctypes.addressof(pc), ctypes.addressof(mi),
                                           ctypes.addressof(ni), ctypes.addressof(ki))
            grid = (m // TILE_I) * (n // TILE_J)

            def launch():
                ck(cuda.cuLaunchKernel(fn, grid, 1, 1, 384, 1, 1, smem, ctypes.c_void_p(stream), params, None),
                   "cuLaunchKernel")

            launch()
            torch.cuda.synchronize()
            err = ((c - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            tflops = timed(launch)
            print(f"{name:<24} {tflops:>9.1f} {torch_tflops:>9.1f} {tflops / torch_tflops:>7.3f} {err:>12.2e} {regs.value} local={spill.value}")


if __name__ == "__main__":
    main()
