// gelu.cu -- element-wise GELU activations (libdevice math, no includes).
//
// Same launch shape as saxpy: correct for any thread count; one element per
// thread when there are at least n threads, else float4 loads and stores when x
// and y are 16-byte aligned. ceil(n / 4) threads for full bandwidth.
#include "khal.h"
#include "common.cuh"

namespace example_gelu {

// Exact GELU: 0.5 v (1 + erf(v / sqrt(2))).
__device__ __forceinline__ float gelu_erf(float v) {
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

// tanh approximation (GPT-2, PyTorch approximate="tanh"):
// 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))).
__device__ __forceinline__ float gelu_tanh_approx(float v) {
    const float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.0f + tanhf(inner));
}

template <float (*F)(float)>
__device__ __forceinline__ void map_f32(const khal::Storage<const float>& x, const khal::Storage<float>& y,
                                        example::u64 gid, example::u64 stride) {
    const example::u64 n = x.len < y.len ? x.len : y.len;
    example::u64 tail = 0;
    if (stride >= n) {
        if (gid < n) y[gid] = F(__ldg(&x[gid]));
        return;
    }
    if (example::aligned16(x.ptr) && example::aligned16(y.ptr)) {
        const float4* x4 = reinterpret_cast<const float4*>(x.ptr);
        float4* y4 = reinterpret_cast<float4*>(y.ptr);
        const example::u64 n4 = n / 4;
        for (example::u64 i = gid; i < n4; i += stride) {
            const float4 v = __ldg(x4 + i);
            y4[i] = make_float4(F(v.x), F(v.y), F(v.z), F(v.w));
        }
        tail = n4 * 4;
    }
    for (example::u64 i = tail + gid; i < n; i += stride) {
        y[i] = F(__ldg(&x[i]));
    }
}

}  // namespace example_gelu

KHAL_ENTRY(gelu, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, y)))
{
    example_gelu::map_f32<example_gelu::gelu_erf>(x, y, KHAL_GLOBAL_ID, KHAL_NUM_GROUPS * 256ull);
}

KHAL_ENTRY(gelu_tanh, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, y)))
{
    example_gelu::map_f32<example_gelu::gelu_tanh_approx>(x, y, KHAL_GLOBAL_ID, KHAL_NUM_GROUPS * 256ull);
}
