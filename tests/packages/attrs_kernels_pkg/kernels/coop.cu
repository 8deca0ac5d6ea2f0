// reductionMultiBlockCG (CUDA samples): a sum in one launch. Each block reduces its grid-stride
// share to one partial, grid.sync() makes every partial visible, block 0 reduces them. Needs a
// cooperative launch (KHAL_COOPERATIVE): every block of the grid co-resident.
#include "khal.h"
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

KHAL_ENTRY(reduce_coop, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, partial), KHAL_STORAGE(float, out),
                              KHAL_SCALAR(unsigned long long, n)),
           KHAL_COOPERATIVE)
{
    __shared__ float s[256];
    cg::grid_group grid = cg::this_grid();
    float v = 0.0f;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        v += x[i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
    grid.sync();
    if (blockIdx.x == 0) {
        float w = 0.0f;
        for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x) w += partial[i];
        s[threadIdx.x] = w;
        __syncthreads();
        for (int h = 128; h > 0; h >>= 1) {
            if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
            __syncthreads();
        }
        if (threadIdx.x == 0) out[0] = s[0];
    }
}

// The two-pass reduction the cooperative one is benchmarked against: pass 1 writes one partial per
// block (grid-stride), pass 2 (one block) sums the partials.
KHAL_ENTRY(reduce_pass1, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, partial),
                               KHAL_SCALAR(unsigned long long, n)))
{
    __shared__ float s[256];
    float v = 0.0f;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        v += x[i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

KHAL_ENTRY(reduce_pass2, 256, (KHAL_STORAGE(const float, partial), KHAL_STORAGE(float, out),
                               KHAL_SCALAR(unsigned int, count)))
{
    __shared__ float s[256];
    float w = 0.0f;
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) w += partial[i];
    s[threadIdx.x] = w;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s[0];
}
