// Hopper matmul for hosts without cuBLAS: C = A * B with bf16 or fp16 operands and fp32
// accumulation and output, through wgmma (sm_90a only: the PTX of an "a" target runs on
// compute capability 9.0 and nothing else, so the host keeps matmul.cu's mma.sync kernel for
// every other GPU). Same layouts as matmul.cu: A(i,k) at i*K + k, B(k,j) at j*K + k,
// C(i,j) at j*M + i; M % 256 == 0, N % 128 == 0, K % 64 == 0.
//
// Both operands are K-major, which is what wgmma reads from shared memory without a transpose.
// The kernel computes C's transpose view: wgmma's M side runs over C's columns j (rows of the
// B buffer) and its N side over C's rows i (rows of the A buffer), so each thread's pairs of
// adjacent accumulator columns are adjacent floats in the column-major C (one 8-byte store).
//
// One block per 128 (j) x 256 (i) tile of C, 3 warpgroups: warpgroup 0 is the producer, one
// thread of which streams 64-deep K slices of both operands into a STAGES-deep ring of shared
// memory with TMA (the tensor maps come from the host; TMA writes the 128-byte swizzle that the
// wgmma descriptors below describe, so no thread touches the data on its way in); warpgroups
// 1 and 2 each own 64 of the 128 j rows and issue m64n256k16 wgmmas. Full/empty mbarriers hand
// each ring slot between them. Blocks are rastered in groups of 8 j-tiles so that a wave
// re-reads the A tiles from L2.

typedef unsigned long long u64;
typedef unsigned short u16;

// CUtensorMap (the driver's opaque 128-byte tensor map), passed by value as a grid constant.
struct __align__(64) TensorMap {
    u64 opaque[16];
};

#define TILE_J 128
#define TILE_I 256
#define TILE_K 64
#define GROUP 8
#define SLOT_J_BYTES (TILE_J * TILE_K * 2)
#define SLOT_I_BYTES (TILE_I * TILE_K * 2)
#define SLOT_BYTES (SLOT_J_BYTES + SLOT_I_BYTES)

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void bar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void bar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void bar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

// Loads the box at (k0, row0) of `map` into shared memory at `dst`; completion counts bytes on `bar`.
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap *map, int k0, int row0,
                                         unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((u64)map), "r"(k0), "r"(row0), "r"(bar)
                 : "memory");
}

// A wgmma shared-memory descriptor for a K-major tile of 128-byte rows in the 128-byte swizzle:
// start address, leading offset 16 B (unused by swizzled K-major layouts), stride 1024 B between
// groups of 8 rows, swizzle mode 1 (128 B).
__device__ __forceinline__ u64 tile_desc(unsigned addr)
{
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

#define WGMMA_D                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define F8(i)                                                                                     \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),   \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define F64(i) F8(i), F8(i + 8), F8(i + 16), F8(i + 24), F8(i + 32), F8(i + 40), F8(i + 48), F8(i + 56)

// d (64 x 256, fp32, 128 registers per thread) += tile(a) (64 x 16) * tile(b)^T (256 x 16).
template <int BF16>
__device__ __forceinline__ void wgmma_64x256x16(float *d, u64 a, u64 b)
{
    if (BF16)
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WGMMA_D
                     ", %128, %129, 1, 1, 1, 0, 0;\n"
                     : F64(0), F64(64)
                     : "l"(a), "l"(b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " WGMMA_D
                     ", %128, %129, 1, 1, 1, 0, 0;\n"
                     : F64(0), F64(64)
                     : "l"(a), "l"(b));
}

// Orders the accumulators' register writes (the zeroing, earlier wgmmas) before the next wgmma.
__device__ __forceinline__ void wgmma_fence(float *d)
{
#pragma unroll
    for (int r = 0; r < 128; r++) asm volatile("" : "+f"(d[r])::"memory");
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait(float *d)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#pragma unroll
    for (int r = 0; r < 128; r++) asm volatile("" : "+f"(d[r])::"memory");
}

template <int BF16, int STAGES, int REGS>
__device__ __forceinline__ void gemm(const TensorMap *map_a, const TensorMap *map_b,
                                     float *__restrict__ C, int M, int N, int K)
{
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // The 128-byte swizzle repeats every 1024 bytes: slots start on a 1024-byte boundary.
    const unsigned base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const unsigned bars = base + STAGES * SLOT_BYTES; // full[STAGES], then empty[STAGES]
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

    const int tiles_j = N / TILE_J, tiles_i = M / TILE_I;
    const int bid = blockIdx.x, per_group = GROUP * tiles_i;
    const int first_j = (bid / per_group) * GROUP;
    const int gsize = min(tiles_j - first_j, GROUP);
    const int j0 = (first_j + (bid % per_group) % gsize) * TILE_J;
    const int i0 = ((bid % per_group) / gsize) * TILE_I;
    const int ktiles = K / TILE_K;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            bar_init(bars + 8 * s, 1);
            bar_init(bars + 8 * (STAGES + s), 2);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        if (REGS) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            for (int kt = 0; kt < ktiles; kt++) {
                const int s = kt % STAGES;
                if (kt >= STAGES) bar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) - 1) & 1);
                const unsigned full = bars + 8 * s, slot = base + s * SLOT_BYTES;
                bar_expect(full, SLOT_BYTES);
                tma_load(slot, map_b, kt * TILE_K, j0, full);
                tma_load(slot + SLOT_J_BYTES, map_a, kt * TILE_K, i0, full);
            }
        }
        return;
    }
    if (REGS) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");

    const int half = wg - 1; // which 64 of the tile's 128 j rows
    float d[128];
#pragma unroll
    for (int r = 0; r < 128; r++) d[r] = 0.0f;

    for (int kt = 0; kt < ktiles; kt++) {
        const int s = kt % STAGES;
        bar_wait(bars + 8 * s, (kt / STAGES) & 1);
        const unsigned slot = base + s * SLOT_BYTES;
        const u64 da = tile_desc(slot + half * 64 * 128), db = tile_desc(slot + SLOT_J_BYTES);
        wgmma_fence(d);
#pragma unroll
        for (int kk = 0; kk < TILE_K / 16; kk++)
            // 16 halves = 32 bytes further along K: +2 in the descriptor's 16-byte units.
            wgmma_64x256x16<BF16>(d, da + 2 * kk, db + 2 * kk);
        wgmma_commit();
        // Keep this slice's wgmmas in flight; the previous slice's are done, so its slot is free.
        wgmma_wait<1>(d);
        if (kt > 0 && tid == 0) bar_arrive(bars + 8 * (STAGES + (kt - 1) % STAGES));
    }
    wgmma_wait<0>(d);

    // Accumulator layout of m64nNk16: register 4c + r of thread (warp w, lane l) holds row
    // w*16 + l/4 + 8*(r/2) and column 8c + 2*(l%4) + r%2.
    const int warp = tid / 32, lane = tid % 32;
    const int jrow = j0 + half * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int c = 0; c < 32; c++) {
        const int i = i0 + c * 8 + (lane % 4) * 2;
        *(float2 *)(C + (u64)jrow * M + i) = make_float2(d[4 * c], d[4 * c + 1]);
        *(float2 *)(C + (u64)(jrow + 8) * M + i) = make_float2(d[4 * c + 2], d[4 * c + 3]);
    }
}

// Dynamic shared memory: STAGES * SLOT_BYTES + 1024 (alignment) + 16 * STAGES (barriers).
// Variants: 4 stages (192 KiB of the 227 KiB a block may have) with the registers moved from the
// producer to the consumers ("r": 232 each, so the 128 accumulators have room), the default; and
// without moving them (the compiler's 168 for 384 threads). Measured on an H200 at 8192^3, bf16,
// against PyTorch's cuBLAS in the same run: s4r 813 TFLOP/s (0.99x), s4 742 (0.90x), 3 stages
// with registers moved 714 (0.87x).
#define KERNEL(name, bf16, stages, regs)                                                          \
    extern "C" __global__ void __launch_bounds__(384, 1)                                          \
        name(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b,   \
             float *C, int M, int N, int K)                                                       \
    {                                                                                             \
        gemm<bf16, stages, regs>(&map_a, &map_b, C, M, N, K);                                     \
    }

KERNEL(wgmma_gemm_bf16_s4r, 1, 4, 1)
KERNEL(wgmma_gemm_f16_s4r, 0, 4, 1)
KERNEL(wgmma_gemm_bf16_s4, 1, 4, 0)
KERNEL(wgmma_gemm_f16_s4, 0, 4, 0)
