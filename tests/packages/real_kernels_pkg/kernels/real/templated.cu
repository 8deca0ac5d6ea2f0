// Templated entries: one declaration, one entry per KHAL_INSTANTIATE line.
#include <cuda/std/complex>

template <typename T>
KHAL_ENTRY(scale, 256, (KHAL_STORAGE(T, x), KHAL_SCALAR(T, a)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < x.len) x[i] = x[i] * a;
}
KHAL_INSTANTIATE(scale, scale_f32, float)
KHAL_INSTANTIATE(scale, scale_f64, double)
KHAL_INSTANTIATE(scale, scale_c64, cuda::std::complex<float>)
KHAL_INSTANTIATE(scale, scale_c128, cuda::std::complex<double>)

// cuSignal style: two template parameters, __restrict__, and a grid-stride loop over
// blockIdx / blockDim / gridDim exactly as written for CUDA (remapped in the indirect variant)
template <typename T, typename R>
KHAL_ENTRY(abs2, 128, (KHAL_STORAGE(const T __restrict__, inp), KHAL_STORAGE(R __restrict__, out)))
{
    const int tx = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = blockDim.x * gridDim.x;
    for (int i = tx; i < (int)inp.len; i += stride) {
        const T v = inp[i];
        out[i] = v.real() * v.real() + v.imag() * v.imag();
    }
}
KHAL_INSTANTIATE(abs2, abs2_c64, cuda::std::complex<float>, float)
KHAL_INSTANTIATE(abs2, abs2_c128, cuda::std::complex<double>, double)
