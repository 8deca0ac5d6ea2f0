// 2-D and 3-D launches. CuPy ndimage style: the body computes its indices from blockIdx,
// blockDim and threadIdx itself; or from KHAL_GLOBAL_ID_X / _Y / _Z.
KHAL_ENTRY(add2d, (16, 16), (KHAL_STORAGE(const float, a), KHAL_STORAGE(float, out), KHAL_SCALAR(int, nx),
                             KHAL_SCALAR(int, ny)))
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < nx && y < ny) out[y * nx + x] = a[y * nx + x] + (float)(x * 1000 + y);
}

KHAL_ENTRY(grid3d, (8, 8, 4), (KHAL_STORAGE(unsigned, out), KHAL_SCALAR(unsigned, nx), KHAL_SCALAR(unsigned, ny),
                               KHAL_SCALAR(unsigned, nz)))
{
    uint64_t x = KHAL_GLOBAL_ID_X, y = KHAL_GLOBAL_ID_Y, z = KHAL_GLOBAL_ID_Z;
    if (x < nx && y < ny && z < nz) out[(z * ny + y) * nx + x] = (unsigned)(x + 100 * y + 10000 * z);
}

// a 1-D block over a 2-D grid, the batch in y (cuSignal does this): 2-D because the body reads blockIdx.y
KHAL_ENTRY(batch_scale, 128, (KHAL_STORAGE(const float, a), KHAL_STORAGE(float, out), KHAL_SCALAR(int, n)))
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    if (i < n) out[b * n + i] = a[b * n + i] * (float)(b + 1);
}

// a block size chosen per launch (data-dependent), within its launch bounds
KHAL_ENTRY(iota_any_block, 256, (KHAL_STORAGE(unsigned, out), KHAL_STORAGE(unsigned, block_seen)),
           KHAL_LAUNCH_BOUNDS(1024))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < out.len) out[i] = (unsigned)i;
    if (i == 0) block_seen[0] = blockDim.x;
}
