// radix.cu -- a radix partition pass over uint32 keys, 8 bits at a time:
//
//   histogram_digits  hist[d] += #keys whose digit (key >> shift) & 255 is d
//   exclusive_scan    offsets = exclusive prefix sum of hist (total = sum)
//   scatter_digits    out[offsets[d]++] = key, bucketed by digit
//
// histogram_digits and scatter_digits accumulate into their array (zero
// `hist` first; `offsets` is consumed and ends as each bucket's end). Within a
// warp scatter_digits keeps key order; across warps the order inside a bucket
// follows atomic arrival, so the pass partitions by digit but is not stable:
// it is the bucketing step of an MSD radix sort (shift 24 first, then each
// bucket on its own), not a pass of an LSD sort, which needs stability.
#include "khal.h"
#include "common.cuh"

namespace example_radix {
enum : unsigned { kRadixBins = 256, kRadixMask = kRadixBins - 1 };
}  // namespace example_radix

// shift: 0, 8, 16 or 24 (taken modulo 32).
KHAL_ENTRY(histogram_digits, 256, (KHAL_STORAGE(const uint32_t, keys),
                                   KHAL_STORAGE_ARRAY(uint32_t, 256, hist),
                                   KHAL_SCALAR(uint32_t, shift)))
{
    __shared__ uint32_t local_hist[example_radix::kRadixBins];
    const unsigned tid = KHAL_LOCAL_ID;  // block size == bin count: one bin per thread
    const unsigned s = shift & 31u;
    const example::u64 n = keys.len;
    const example::u64 stride = KHAL_NUM_GROUPS * 256ull;

    __syncthreads();  // a previous group of a persistent loop may still flush local_hist
    local_hist[tid] = 0;
    __syncthreads();
    for (example::u64 i = KHAL_GLOBAL_ID; i < n; i += stride) {
        atomicAdd(&local_hist[(__ldg(&keys[i]) >> s) & example_radix::kRadixMask], 1u);
    }
    __syncthreads();
    const uint32_t c = local_hist[tid];
    if (c != 0) atomicAdd(&hist[tid], c);
}

// Exclusive prefix sum of `input` into `output` (uint32, wrapping), and the
// grand total into `total`. Runs in a single group of 1024 threads that walks
// the array in chunks of 4096 carrying the running sum, so it suits the small
// arrays of a radix pass (256 bins, per-tile counts); groups other than the
// first return at once, so launching 1024 threads is enough at any length.
// Writes min(len(input), len(output)) outputs.
KHAL_ENTRY(exclusive_scan, 1024, (KHAL_STORAGE(const uint32_t, input),
                                  KHAL_STORAGE(uint32_t, output),
                                  KHAL_STORAGE_VALUE(uint32_t, total)))
{
    KHAL_FIXED_BLOCK();  // kBlock is the compiled block: launch() must keep it
    constexpr unsigned kBlock = 1024;
    constexpr unsigned kItems = 4;
    constexpr unsigned kChunk = kBlock * kItems;
    constexpr unsigned kWarps = kBlock / example::kWarpSize;
    __shared__ uint32_t warp_totals[kWarps];
    __shared__ uint32_t chunk_total;

    if (KHAL_GROUP_ID == 0) {  // uniform over the block: barriers below are safe
        const unsigned tid = KHAL_LOCAL_ID;
        const unsigned lane = example::lane_id();
        const unsigned warp = example::warp_id();
        const example::u64 n = input.len < output.len ? input.len : output.len;
        uint32_t carry = 0;
        for (example::u64 base = 0; base < n; base += kChunk) {
            const example::u64 first = base + static_cast<example::u64>(tid) * kItems;
            uint32_t items[kItems];
            uint32_t thread_sum = 0;
#pragma unroll
            for (unsigned k = 0; k < kItems; ++k) {
                items[k] = first + k < n ? input[first + k] : 0u;
                thread_sum += items[k];
            }
            const uint32_t inclusive = example::warp_inclusive_scan(thread_sum);
            __syncthreads();  // warp_totals / chunk_total of the previous chunk are read
            if (lane == example::kWarpSize - 1) warp_totals[warp] = inclusive;
            __syncthreads();
            if (warp == 0) {
                const uint32_t wt = warp_totals[lane];  // kWarps == 32
                const uint32_t wscan = example::warp_inclusive_scan(wt);
                warp_totals[lane] = wscan - wt;  // exclusive warp offsets
                if (lane == kWarps - 1) chunk_total = wscan;
            }
            __syncthreads();
            uint32_t running = carry + warp_totals[warp] + (inclusive - thread_sum);
#pragma unroll
            for (unsigned k = 0; k < kItems; ++k) {
                if (first + k < n) output[first + k] = running;
                running += items[k];
            }
            carry += chunk_total;
        }
        if (tid == 0) total = carry;
    }
}

// out[offsets[d]++] = key for each key with digit d. `out` needs len(keys)
// slots after the starting offsets; writes past len(out) are dropped.
// Lanes of a warp that share a digit are grouped with __match_any_sync and take
// consecutive slots with one atomicAdd per group.
KHAL_ENTRY(scatter_digits, 256, (KHAL_STORAGE(const uint32_t, keys),
                                 KHAL_STORAGE_ARRAY(uint32_t, 256, offsets),
                                 KHAL_STORAGE(uint32_t, out),
                                 KHAL_SCALAR(uint32_t, shift)))
{
    const unsigned s = shift & 31u;
    const unsigned lane = example::lane_id();
    const example::u64 n = keys.len;
    const example::u64 stride = KHAL_NUM_GROUPS * 256ull;
    // The trip count is uniform over the warp (its lanes hold consecutive ids),
    // so every lane takes part in the warp intrinsics below.
    for (example::u64 i = KHAL_GLOBAL_ID; __any_sync(example::kFullMask, i < n); i += stride) {
        const bool valid = i < n;
        const uint32_t key = valid ? __ldg(&keys[i]) : 0u;
        const unsigned digit = valid ? ((key >> s) & example_radix::kRadixMask) : example_radix::kRadixBins;  // sentinel
        const unsigned peers = __match_any_sync(example::kFullMask, digit);
        const unsigned leader = static_cast<unsigned>(__ffs(peers)) - 1u;
        const unsigned rank = static_cast<unsigned>(__popc(peers & example::lanemask_lt()));
        uint32_t slot = 0;
        if (valid && lane == leader) slot = atomicAdd(&offsets[digit], static_cast<uint32_t>(__popc(peers)));
        slot = __shfl_sync(example::kFullMask, slot, leader) + rank;
        if (valid && slot < out.len) out[slot] = key;
    }
}
