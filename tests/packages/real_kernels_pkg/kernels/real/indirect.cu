// Bodies that read blockIdx / gridDim directly, as every ported kernel does.

// Correct in the indirect variant: the body's blockIdx / gridDim are the group it runs.
KHAL_ENTRY(stamp, 64, (KHAL_STORAGE(unsigned, out), KHAL_STORAGE(unsigned, groups_seen)))
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < out.len) out[i] = i * 3u + gridDim.x;
    if (threadIdx.x == 0 && blockIdx.x < groups_seen.len) atomicAdd(&groups_seen[blockIdx.x], 1u);
}

// Shared memory per group: the persistent loop keeps groups apart with a barrier.
KHAL_ENTRY(block_sum, 128, (KHAL_STORAGE(const float, a), KHAL_STORAGE(float, sums)))
{
    __shared__ float tile[128];
    unsigned i = blockIdx.x * 128 + threadIdx.x;
    tile[threadIdx.x] = i < a.len ? a[i] : 0.0f;
    __syncthreads();
    for (unsigned s = 64; s > 0; s >>= 1) {
        if (threadIdx.x < s) tile[threadIdx.x] += tile[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0 && blockIdx.x < sums.len) sums[blockIdx.x] = tile[0];
}

// A helper reads the real blockIdx: the indirect variant would be wrong, so the build leaves it out.
__device__ __noinline__ unsigned my_block() { return blockIdx.x; }

KHAL_ENTRY(stamp_helper, 64, (KHAL_STORAGE(unsigned, out)))
{
    unsigned i = my_block() * 64u + threadIdx.x;
    if (i < out.len) out[i] = i;
}
