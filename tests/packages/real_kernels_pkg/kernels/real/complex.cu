// Complex numbers: thrust::complex (usable under NVRTC through hatch-khal's include folder)
// and cuda::std::complex, as storage elements and as scalars.
#include <thrust/complex.h>
#include <cuda/std/complex>

KHAL_ENTRY(cmul_thrust, 256, (KHAL_STORAGE(const thrust::complex<float>, a),
                              KHAL_STORAGE(thrust::complex<float>, out),
                              KHAL_SCALAR(thrust::complex<float>, w)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < out.len) out[i] = a[i] * w + thrust::conj(a[i]);
}

KHAL_ENTRY(cexp_std, 256, (KHAL_STORAGE(const cuda::std::complex<double>, a),
                           KHAL_STORAGE(cuda::std::complex<double>, out),
                           KHAL_SCALAR(cuda::std::complex<double>, w)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < out.len) out[i] = cuda::std::exp(a[i]) * w;
}
