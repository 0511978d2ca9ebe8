// Bandwidth kernels: a 16-byte copy and a STREAM triad. 16-byte accesses per thread, coalesced
// across the warp, because narrower ones leave HBM bandwidth on the table.
// Compiled ahead of time to PTX by kernels/gen_ptx.py (NVRTC, no headers).

typedef unsigned long long u64;

extern "C" __global__ void copy_u4(const uint4 *__restrict__ src, uint4 *__restrict__ dst, u64 n)
{
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i];
}

// a = b + s * c over float4 elements (STREAM triad: two reads, one write per element).
extern "C" __global__ void triad_f4(float4 *__restrict__ a, const float4 *__restrict__ b,
                                    const float4 *__restrict__ c, float s, u64 n)
{
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float4 x = b[i], y = c[i];
        a[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
    }
}

// Fills a buffer with non-zero floats, so nothing is timed on zeros.
extern "C" __global__ void fill_f4(float4 *p, u64 n, float v)
{
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = make_float4(v, v + 1.0f, v + 2.0f, (float)(i & 1023));
}
