// cub_kernels.cu -- block-wide primitives from CUB (nvidia-cuda-cccl wheel).
#include "khal.h"
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_radix_sort.cuh>

// Sum of x into out (accumulated: zero it first). Each group folds a strided
// range of x, then cub::BlockReduce and one atomicAdd per group.
KHAL_ENTRY(sum_cub, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE_VALUE(float, out)))
{
    using BlockReduce = cub::BlockReduce<float, 256>;
    __shared__ typename BlockReduce::TempStorage temp;
    const uint64_t stride = KHAL_NUM_GROUPS * 256ull;
    float acc = 0.0f;
    for (uint64_t i = KHAL_GLOBAL_ID; i < x.len; i += stride) acc += x[i];
    const float total = BlockReduce(temp).Sum(acc);
    if (KHAL_LOCAL_ID == 0) atomicAdd(&out, total);
    __syncthreads();  // temp is reused if this body runs again (indirect dispatch)
}

// Sorts each tile of SORT_TILE (= 128 threads x 4 keys) consecutive keys in place,
// ascending, with cub::BlockRadixSort. Launch one group per tile:
// example_shader_pkg.sort_tiles_threads(n). The last tile may be partial.
KHAL_ENTRY(sort_tiles, 128, (KHAL_STORAGE(uint32_t, keys)))
{
    KHAL_FIXED_BLOCK();  // the sort's block is 128 threads, and a tile 512 keys: launch() keeps the block
    using Sort = cub::BlockRadixSort<uint32_t, 128, 4>;
    __shared__ typename Sort::TempStorage temp;
    const uint64_t base = KHAL_GROUP_ID * 512ull + KHAL_LOCAL_ID * 4ull;
    uint32_t k[4];
    for (int j = 0; j < 4; ++j) k[j] = base + j < keys.len ? keys[base + j] : 0xFFFFFFFFu;
    Sort(temp).Sort(k);  // blocked arrangement: thread t holds ranks 4t .. 4t+3
    for (int j = 0; j < 4; ++j)
        if (base + j < keys.len) keys[base + j] = k[j];
    __syncthreads();
}
