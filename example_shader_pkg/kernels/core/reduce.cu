// reduce.cu -- sum of a float storage into one value.
#include "khal.h"
#include "common.cuh"

// out += sum(x). `out` must be zeroed by the caller for a plain sum (it is
// accumulated into, one atomicAdd per block, so several launches can add up).
//
// Any thread count >= 1 is correct. At most kMaxGroups groups work (about one
// wave on a large GPU; groups past it return at once); each thread sums a
// grid-strided range of x (float4 loads when x is 16-byte aligned, four loads
// in flight), the block combines with warp shuffles and shared memory, and
// thread 0 adds the block's sum. Launch example_shader_pkg.reduce_sum_threads(n)
// threads: on an H200 that reads at copy bandwidth, while n threads (a
// million mostly idle groups at 2^28 elements) reaches only about a third.
KHAL_ENTRY(reduce_sum, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE_VALUE(float, out)))
{
    constexpr unsigned kBlock = 256;
    constexpr example::u64 kMaxGroups = 1024;
    const example::u64 groups = KHAL_NUM_GROUPS < kMaxGroups ? KHAL_NUM_GROUPS : kMaxGroups;
    if (KHAL_GROUP_ID >= groups) return;  // uniform over the block: no barrier is skipped by part of it
    const example::u64 n = x.len;
    const example::u64 stride = groups * kBlock;
    const example::u64 gid = KHAL_GLOBAL_ID;
    const float* p = x.ptr;
    float acc = 0.0f;
    example::u64 tail_start = 0;
    if (example::aligned16(p)) {
        const float4* p4 = reinterpret_cast<const float4*>(p);
        const example::u64 n4 = n / 4;
        example::u64 i = gid;
        for (; i + 3 * stride < n4; i += 4 * stride) {
            const float4 a = __ldg(p4 + i);
            const float4 b = __ldg(p4 + i + stride);
            const float4 c = __ldg(p4 + i + 2 * stride);
            const float4 d = __ldg(p4 + i + 3 * stride);
            acc += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
            acc += ((c.x + c.y) + (c.z + c.w)) + ((d.x + d.y) + (d.z + d.w));
        }
        for (; i < n4; i += stride) {
            const float4 a = __ldg(p4 + i);
            acc += (a.x + a.y) + (a.z + a.w);
        }
        tail_start = n4 * 4;
    }
    for (example::u64 i = tail_start + gid; i < n; i += stride) {
        acc += __ldg(p + i);
    }
    const float block_sum = example::block_reduce_sum<kBlock>(acc);
    // Blocks past the data add exactly 0: skip their atomic.
    if (KHAL_LOCAL_ID == 0 && block_sum != 0.0f) atomicAdd(&out, block_sum);
}
