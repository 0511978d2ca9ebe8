// Built-in tensor-core matmul for hosts without cuBLAS: C = A * B with bf16 or fp16 operands and
// fp32 accumulation and output, through mma.sync m16n8k16 (sm_80+; Hopper runs it too).
// Layouts match the cuBLASLt "TN" call of the matmul probe: A(i,k) at i*K + k, B(k,j) at j*K + k,
// C(i,j) at j*M + i. M % 128 == 0, N % 256 == 0, K % 64 == 0 (the host keeps sizes to multiples of 256).
// Block tile 128x256xBK, 8 warps of 64x64, a STAGES-deep cp.async pipeline, ldmatrix from padded
// shared memory rows (BK + 8 halves: conflict-free 16-byte rows for ldmatrix), and blocks
// rastered in groups of 8 M-tiles so a wave re-reads B from L2 rather than from HBM.
// Variants (BK, STAGES) are separate kernels so the host can pick the fastest. Measured on an
// H200: 128x256x64 with 3 stages 292 TFLOP/s bf16, 32-deep K tiles 253-263; loading the next
// fragments before the current MMAs (register double-buffering) changed nothing, so it was
// dropped. Reaching half of cuBLAS needs wgmma (sm_90a), which mma.sync cannot match.
// Also the fill kernel that writes the probe's random inputs, mirrored on the host.

typedef unsigned long long u64;
typedef unsigned short u16;

#define BM 128
#define BN 256
#define GROUP_M 8

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3,
                                            const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

// Not volatile: a pure register operation the compiler may interleave with fragment loads.
template <int BF16>
__device__ __forceinline__ void mma16816(float *d, const unsigned *a, const unsigned *b)
{
    if (BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int BF16, int BK, int STAGES>
__device__ __forceinline__ void gemm(const u16 *__restrict__ A, const u16 *__restrict__ B,
                                     float *__restrict__ C, int M, int N, int K)
{
    constexpr int LDS = BK + 8;
    constexpr int CHUNKS = BK / 8; // 16-byte chunks per tile row
    extern __shared__ __align__(16) u16 smem[];
    u16 *As = smem;                          // [STAGES][BM][LDS]
    u16 *Bs = smem + STAGES * BM * LDS;      // [STAGES][BN][LDS]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 64;
    // Grouped raster over a 1-D grid: GROUP_M tile rows share each B column tile in L2.
    const int tiles_m = M / BM, tiles_n = N / BN;
    const int bid = blockIdx.x, per_group = GROUP_M * tiles_n;
    const int first_m = (bid / per_group) * GROUP_M;
    const int gsize = min(tiles_m - first_m, GROUP_M);
    const int m0 = (first_m + (bid % per_group) % gsize) * BM;
    const int n0 = ((bid % per_group) / gsize) * BN;
    const u16 *Ab = A + (u64)m0 * K;
    const u16 *Bb = B + (u64)n0 * K;
    const int ktiles = K / BK;

    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;

    auto load = [&](int stage, int kt) {
        const int k0 = kt * BK;
#pragma unroll
        for (int c = 0; c < BM * CHUNKS / 256; c++) {
            int idx = tid + c * 256, r = idx / CHUNKS, q = idx % CHUNKS;
            cp_async16(As + (stage * BM + r) * LDS + q * 8, Ab + (u64)r * K + k0 + q * 8);
        }
#pragma unroll
        for (int c = 0; c < BN * CHUNKS / 256; c++) {
            int idx = tid + c * 256, r = idx / CHUNKS, q = idx % CHUNKS;
            cp_async16(Bs + (stage * BN + r) * LDS + q * 8, Bb + (u64)r * K + k0 + q * 8);
        }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }

    for (int kt = 0; kt < ktiles; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();
        int next = kt + STAGES - 1;
        if (next < ktiles) load(next % STAGES, next);
        asm volatile("cp.async.commit_group;\n" ::);
        const u16 *as = As + (kt % STAGES) * BM * LDS;
        const u16 *bs = Bs + (kt % STAGES) * BN * LDS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned af[4][4], bf[8][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u16 *p = as + (wm + i * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8;
                ldmatrix_x4(af[i][0], af[i][1], af[i][2], af[i][3], p);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u16 *p =
                    bs + (wn + j * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kk + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(bf[2 * j][0], bf[2 * j][1], bf[2 * j + 1][0], bf[2 * j + 1][1], p);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) mma16816<BF16>(acc[i][j], af[i], bf[j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int row = m0 + wm + i * 16 + (lane >> 2);
            int col = n0 + wn + j * 8 + (lane & 3) * 2;
            C[(u64)col * M + row] = acc[i][j][0];
            C[(u64)(col + 1) * M + row] = acc[i][j][1];
            C[(u64)col * M + row + 8] = acc[i][j][2];
            C[(u64)(col + 1) * M + row + 8] = acc[i][j][3];
        }
}

extern "C" __global__ void __launch_bounds__(256, 1)
    mma_gemm_bf16_k64s3(const u16 *A, const u16 *B, float *C, int M, int N, int K)
{
    gemm<1, 64, 3>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
    mma_gemm_f16_k64s3(const u16 *A, const u16 *B, float *C, int M, int N, int K)
{
    gemm<0, 64, 3>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
    mma_gemm_bf16_k32s3(const u16 *A, const u16 *B, float *C, int M, int N, int K)
{
    gemm<1, 32, 3>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
    mma_gemm_f16_k32s3(const u16 *A, const u16 *B, float *C, int M, int N, int K)
{
    gemm<0, 32, 3>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
    mma_gemm_bf16_k32s4(const u16 *A, const u16 *B, float *C, int M, int N, int K)
{
    gemm<1, 32, 4>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
    mma_gemm_f16_k32s4(const u16 *A, const u16 *B, float *C, int M, int N, int K)
{
    gemm<0, 32, 4>(A, B, C, M, N, K);
}

__device__ __forceinline__ unsigned hash32(unsigned x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Element i of a random matrix is k / 2^shift with k a small integer from a hash of (i, seed),
// so every type (fp32, tf32, bf16, fp16, fp8 e4m3) holds it exactly and the host can recompute
// it for the reference. dtype: 0 fp32, 1 bf16, 2 fp16, 3 fp8 e4m3 (k in [-8, 8] / 8; else
// [-64, 64] / 64).
extern "C" __global__ void fill_matrix(void *p, u64 n, unsigned seed, int dtype)
{
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned h = hash32(hash32((unsigned)i ^ hash32((unsigned)(i >> 32))) ^ seed);
        int k, shift;
        if (dtype == 3) { k = (int)(h % 17u) - 8; shift = 3; }
        else { k = (int)(h % 129u) - 64; shift = 6; }
        unsigned sign = k < 0 ? 1u : 0u;
        unsigned a = (unsigned)(k < 0 ? -k : k);
        unsigned bits = 0;
        if (a != 0) {
            int e = 31 - __clz(a);            // a = 2^e + mant
            unsigned mant = a - (1u << e);
            int ex = e - shift;               // the value's binary exponent
            if (dtype == 0) bits = (sign << 31) | ((unsigned)(ex + 127) << 23) | (mant << (23 - e));
            else if (dtype == 1) bits = (sign << 15) | ((unsigned)(ex + 127) << 7) | (mant << (7 - e));
            else if (dtype == 2) bits = (sign << 15) | ((unsigned)(ex + 15) << 10) | (mant << (10 - e));
            else bits = (sign << 7) | ((unsigned)(ex + 7) << 3) | (mant << (3 - e));
        } else {
            bits = 0;
        }
        if (dtype == 0) ((unsigned *)p)[i] = bits;
        else if (dtype == 3) ((unsigned char *)p)[i] = (unsigned char)bits;
        else ((u16 *)p)[i] = (u16)bits;
    }
}
