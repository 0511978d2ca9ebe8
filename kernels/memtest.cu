// Memory pattern test: write a pattern over a buffer, read it back, count mismatches and keep the
// first few indices. Patterns: 0 constant word, 1 walking ones (bit (i + shift) % 32 set),
// 2 address-in-address (the word's own byte address folded to 32 bits), so stuck bits, coupling
// and addressing faults all show up.

typedef unsigned long long u64;

__device__ __forceinline__ unsigned expected_word(unsigned mode, unsigned pattern, u64 i,
                                                  const unsigned *base)
{
    if (mode == 1)
        return 1u << ((unsigned)((i + pattern) & 31));
    if (mode == 2) {
        u64 addr = (u64)(base + i);
        return (unsigned)addr ^ (unsigned)(addr >> 32) ^ pattern;
    }
    return pattern;
}

extern "C" __global__ void mem_write(unsigned *p, u64 n, unsigned mode, unsigned pattern)
{
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = expected_word(mode, pattern, i, p);
}

// errors[0] counts mismatches; bad[2k] is the index of the k-th one and bad[2k+1] the flipped bits.
extern "C" __global__ void mem_check(const unsigned *p, u64 n, unsigned mode, unsigned pattern,
                                     u64 *errors, u64 *bad, unsigned max_bad)
{
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned want = expected_word(mode, pattern, i, p);
        unsigned got = p[i];
        if (got != want) {
            u64 slot = atomicAdd(errors, 1ULL);
            if (slot < max_bad) {
                bad[2 * slot] = i;
                bad[2 * slot + 1] = (u64)(got ^ want);
            }
        }
    }
}

// Test hook: flips one bit after the write pass, so tests can prove the check finds it.
extern "C" __global__ void mem_flip_bit(unsigned *p, u64 index, unsigned bit)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        p[index] ^= 1u << (bit & 31);
}
