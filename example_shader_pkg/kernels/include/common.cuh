// common.cuh -- warp/block helpers shared by the example crates.
//
// Every helper here that synchronises (block_reduce_*, the scan in
// exclusive_scan) must be reached by *all* threads of the block: entry bodies
// therefore never return early before calling them. Warp-level helpers use a
// full mask and need the whole warp converged, which holds because every
// example entry uses a block size that is a multiple of 32 and keeps its loops
// warp-uniform.
#ifndef EXAMPLE_COMMON_CUH
#define EXAMPLE_COMMON_CUH

#include "khal.h"

namespace example {

typedef unsigned long long u64;

// Enumerators, not constexpr variables: NVRTC emits a namespace-scope
// constexpr as a .global in the module.
enum : unsigned { kFullMask = 0xffffffffu, kWarpSize = 32 };

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & (kWarpSize - 1); }
__device__ __forceinline__ unsigned warp_id() { return threadIdx.x / kWarpSize; }

// True when p may be read as float4/uint4 (16-byte aligned).
template <typename T>
__device__ __forceinline__ bool aligned16(const T* p) {
    return (reinterpret_cast<u64>(p) & 15ull) == 0;
}

// Bits of the lanes below this one (PTX %lanemask_lt).
__device__ __forceinline__ unsigned lanemask_lt() {
    return (1u << lane_id()) - 1u;
}

__device__ __forceinline__ float warp_reduce_sum(float v) {
#pragma unroll
    for (unsigned offset = kWarpSize / 2; offset > 0; offset /= 2) {
        v += __shfl_down_sync(kFullMask, v, offset);
    }
    return v;
}

__device__ __forceinline__ unsigned warp_reduce_sum(unsigned v) {
#pragma unroll
    for (unsigned offset = kWarpSize / 2; offset > 0; offset /= 2) {
        v += __shfl_down_sync(kFullMask, v, offset);
    }
    return v;
}

// Inclusive prefix sum over the lanes of a warp.
__device__ __forceinline__ unsigned warp_inclusive_scan(unsigned v) {
    const unsigned lane = lane_id();
#pragma unroll
    for (unsigned offset = 1; offset < kWarpSize; offset *= 2) {
        const unsigned other = __shfl_up_sync(kFullMask, v, offset);
        if (lane >= offset) v += other;
    }
    return v;
}

// Sum over the block; the result is valid in thread 0 only. BLOCK must be the
// entry's block size (a multiple of 32, at most 1024). Safe to call several
// times in a row (e.g. once per group of a persistent-grid loop): the leading
// barrier keeps a new call from overwriting partials the previous one still reads.
template <unsigned BLOCK, typename T>
__device__ __forceinline__ T block_reduce_sum(T v) {
    static_assert(BLOCK % kWarpSize == 0 && BLOCK <= 1024, "block size must be a multiple of 32");
    __shared__ T warp_sums[BLOCK / kWarpSize];
    v = warp_reduce_sum(v);
    __syncthreads();
    if (lane_id() == 0) warp_sums[warp_id()] = v;
    __syncthreads();
    T total = T(0);
    if (warp_id() == 0) {
        total = lane_id() < BLOCK / kWarpSize ? warp_sums[lane_id()] : T(0);
        total = warp_reduce_sum(total);
    }
    return total;
}

// Warp-aggregated atomic append: every lane of the (converged, full) warp
// calls it; lanes with `pred` get consecutive slots of *counter in lane order,
// with one atomicAdd per warp. Returns the slot (meaningless where !pred).
__device__ __forceinline__ unsigned warp_append(unsigned* counter, bool pred) {
    const unsigned mask = __ballot_sync(kFullMask, pred);
    unsigned base = 0;
    if (lane_id() == 0 && mask != 0) base = atomicAdd(counter, static_cast<unsigned>(__popc(mask)));
    base = __shfl_sync(kFullMask, base, 0);
    return base + static_cast<unsigned>(__popc(mask & lanemask_lt()));
}

}  // namespace example

#endif  // EXAMPLE_COMMON_CUH
