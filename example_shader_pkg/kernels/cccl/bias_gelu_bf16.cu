// bias_gelu_bf16.cu -- y = gelu(x + bias[col]) in bfloat16, accumulated in float.
// The kind of fused epilogue a transformer MLP needs; <cuda_bf16.h> comes from
// the nvidia-cuda-runtime wheel the khal hook puts on the include path.
#include "khal.h"
#include <cuda_bf16.h>

KHAL_ENTRY(bias_gelu_bf16, 256, (KHAL_STORAGE(const __nv_bfloat16, x),
                                 KHAL_STORAGE(const __nv_bfloat16, bias),
                                 KHAL_STORAGE(__nv_bfloat16, y),
                                 KHAL_SCALAR(uint32_t, cols)))
{
    const uint64_t i = KHAL_GLOBAL_ID;
    const uint64_t n = x.len < y.len ? x.len : y.len;
    if (i >= n || cols == 0) return;
    const float v = __bfloat162float(x[i]) + __bfloat162float(bias[i % cols]);
    const float g = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    y[i] = __float2bfloat16_rn(g);
}
