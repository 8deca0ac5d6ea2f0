// Kernels in the style of cuSignal, CuPy's cupyx.scipy.signal and PBA (the parallel banding
// algorithm), ported as their authors wrote them: the markers say 1-D blocks, the bodies read
// the 2-D ids through templated helpers, or size their work by blockDim. hatch-khal decides the
// launch geometry from the compiled kernel (issue #24), not from the marker.

// cuSignal-style: the 2-D position of this thread, read by a templated helper
template <typename T>
__device__ __forceinline__ void _row_col(T& row, T& col) {
    col = static_cast<T>(blockIdx.x * blockDim.x + threadIdx.x);
    row = static_cast<T>(blockIdx.y * blockDim.y + threadIdx.y);
}

// out[r, c] = a[r, c] * gain + b[c] (a row-broadcast, as upfirdn / channelize kernels index)
KHAL_ENTRY(row_bias, 256, (KHAL_STORAGE(const float, a), KHAL_STORAGE(const float, b), KHAL_STORAGE(float, out),
                           KHAL_SCALAR(int, nx), KHAL_SCALAR(int, ny), KHAL_SCALAR(float, gain)))
{
    int row, col;
    _row_col<int>(row, col);
    if (row < ny && col < nx) out[(uint64_t)row * nx + col] = a[(uint64_t)row * nx + col] * gain + b[col];
}

// PBA-style: the pixel of this thread from a helper (a transpose, as PBA's phase 2 flips bands)
template <int Dummy>
__device__ __forceinline__ int2 _pixel() {
    return make_int2(blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y * blockDim.y + threadIdx.y);
}

KHAL_ENTRY(transpose, 256, (KHAL_STORAGE(const uint32_t, src), KHAL_STORAGE(uint32_t, dst),
                            KHAL_SCALAR(int, width), KHAL_SCALAR(int, height)))
{
    int2 p = _pixel<0>();
    if (p.x < width && p.y < height) dst[(uint64_t)p.x * height + p.y] = src[(uint64_t)p.y * width + p.x];
}

// cuSignal's sosfilt: one block per signal, one thread per second-order section, the number of
// sections chosen at run time (the block); samples pipelined through shared memory. sos rows are
// [b0, b1, b2, a0, a1, a2] with a0 == 1; x is n_signals x n_samples, filtered in place.
KHAL_ENTRY(sosfilt, 1024, (KHAL_STORAGE(const float, sos), KHAL_STORAGE(float, x), KHAL_SCALAR(int, n_samples)))
{
    __shared__ float s_out[1024];
    const int s = threadIdx.x;
    const int n_sections = blockDim.x;
    float* xs = &x[(uint64_t)blockIdx.x * n_samples];
    const float b0 = sos[s * 6 + 0], b1 = sos[s * 6 + 1], b2 = sos[s * 6 + 2];
    const float a1 = sos[s * 6 + 4], a2 = sos[s * 6 + 5];
    float z0 = 0.0f, z1 = 0.0f;
    for (int step = 0; step < n_samples + n_sections - 1; ++step) {
        const int i = step - s;  // the sample this section filters now
        float in = 0.0f;
        if (s == 0) { if (i >= 0 && i < n_samples) in = xs[i]; }
        else in = s_out[s - 1];  // the previous section's output of this sample (last step)
        __syncthreads();
        float y = 0.0f;
        if (i >= 0 && i < n_samples) {
            y = b0 * in + z0;
            z0 = b1 * in - a1 * y + z1;
            z1 = b2 * in - a2 * y;
        }
        s_out[s] = y;
        if (s == n_sections - 1 && i >= 0 && i < n_samples) xs[i] = y;
        __syncthreads();
    }
}

// CuPy-style grid-stride loop: any block and grid cover all of x
KHAL_ENTRY(axpb_strided, 256, (KHAL_STORAGE(float, x), KHAL_SCALAR(float, a), KHAL_SCALAR(float, b)))
{
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < x.len; i += (uint64_t)blockDim.x * gridDim.x)
        x[i] = a * x[i] + b;
}

// the block id through inline PTX (as hand-tuned libraries read %ctaid): no indirect variant,
// since the persistent grid's block is not the group it runs
__device__ __forceinline__ unsigned _ctaid_x() {
    unsigned b;
    asm("mov.u32 %0, %%ctaid.x;" : "=r"(b));
    return b;
}

KHAL_ENTRY(block_ids, 64, (KHAL_STORAGE(uint32_t, out)))
{
    unsigned b = _ctaid_x();
    if (threadIdx.x == 0 && b < out.len) out[b] = b * 10u + 1u;
}

// the same through blockIdx in a helper: no indirect variant either
__device__ __noinline__ unsigned _block_of_helper() { return blockIdx.x; }

KHAL_ENTRY(block_ids_helper, 64, (KHAL_STORAGE(uint32_t, out)))
{
    unsigned b = _block_of_helper();
    if (threadIdx.x == 0 && b < out.len) out[b] = b * 10u + 2u;
}

// hatch-khal's own ids: they fold the compiled block (128) in, so that block stays fixed, and
// x-only ids refuse a 2-D grid
KHAL_ENTRY(folded, 128, (KHAL_STORAGE(float, x), KHAL_SCALAR(float, v)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < x.len) x[i] = v + (float)i;
}
