// saxpy.cu -- y = a * x + y (memory-bound: 8 bytes read, 4 written per element).
#include "khal.h"
#include "common.cuh"
#include "params.cuh"

// Correct for any thread count T. With T >= n each thread does its one element
// (plain coalesced access). With fewer threads, and x and y both 16-byte
// aligned, each thread handles float4s i, i + T, ... and then the last n % 4
// elements one by one; unaligned, it strides over single elements. Launch
// ceil(n / 4) threads (example_shader_pkg.elementwise_threads) for full
// bandwidth: on an H200 that reaches copy bandwidth, n threads about 80% of it.
// Elements past min(len(x), len(y)) are left alone.
KHAL_ENTRY(saxpy, 256, (KHAL_STORAGE(const float, x),
                        KHAL_STORAGE(float, y),
                        KHAL_UNIFORM(SaxpyParams, params)))
{
    const example::u64 n = x.len < y.len ? x.len : y.len;
    const example::u64 stride = KHAL_NUM_GROUPS * 256ull;
    const example::u64 gid = KHAL_GLOBAL_ID;
    const float a = params.a;
    example::u64 tail = 0;
    if (stride >= n) {
        if (gid < n) y[gid] = fmaf(a, __ldg(&x[gid]), y[gid]);
        return;
    }
    if (example::aligned16(x.ptr) && example::aligned16(y.ptr)) {
        const float4* x4 = reinterpret_cast<const float4*>(x.ptr);
        float4* y4 = reinterpret_cast<float4*>(y.ptr);
        const example::u64 n4 = n / 4;
        for (example::u64 i = gid; i < n4; i += stride) {
            const float4 xv = __ldg(x4 + i);
            float4 yv = y4[i];
            yv.x = fmaf(a, xv.x, yv.x);
            yv.y = fmaf(a, xv.y, yv.y);
            yv.z = fmaf(a, xv.z, yv.z);
            yv.w = fmaf(a, xv.w, yv.w);
            y4[i] = yv;
        }
        tail = n4 * 4;
    }
    for (example::u64 i = tail + gid; i < n; i += stride) {
        y[i] = fmaf(a, __ldg(&x[i]), y[i]);
    }
}
