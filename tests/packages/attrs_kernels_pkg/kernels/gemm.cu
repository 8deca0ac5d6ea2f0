// A WMMA GEMM tile kernel in the style of the CUDA samples' compute_gemm: C = A * B for half inputs
// and float accumulators, row-major A (M x K), column-major B (K x N, i.e. B^T row-major), row-major
// C (M x N). One block of 8 warps computes a 128 x 128 tile of C; it stages its A and B^T panels
// of each K step of 64 in dynamic shared memory: (128 + 128) x 64 halves x 2 bytes = 64 KB, more
// than the 48 KB a function may use without opting in: KHAL_SHARED_MEM(65536). M and N must be
// multiples of 128, K of 64.
#include "khal.h"
#include <mma.h>
#include <cuda_fp16.h>

using namespace nvcuda;

#define TILE 128
#define KSTEP 64
#define PAD 0  // halves of padding per row (0: exactly 64 KB)

KHAL_ENTRY(gemm_tile, 256, (KHAL_STORAGE(const __half, a), KHAL_STORAGE(const __half, bt), KHAL_STORAGE(float, c),
                            KHAL_SCALAR(int, m), KHAL_SCALAR(int, n), KHAL_SCALAR(int, k)),
           KHAL_SHARED_MEM(65536))
{
    extern __shared__ __align__(128) unsigned char khal_smem[];
    __half* sa = reinterpret_cast<__half*>(khal_smem);          // TILE x (KSTEP + PAD)
    __half* sb = sa + TILE * (KSTEP + PAD);                      // TILE x (KSTEP + PAD): rows of B^T
    const int tiles_n = n / TILE;
    const int tile_m = blockIdx.x / tiles_n, tile_n = blockIdx.x % tiles_n;
    const int warp = threadIdx.x / 32;
    // 8 warps as 4 (rows) x 2 (cols); each warp: 32 x 64 of C = 2 x 4 fragments of 16 x 16
    const int wr = warp / 2, wc = warp % 2;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < k; k0 += KSTEP) {
        // 128 rows x 64 halves of A and of B^T: 8 halves (16 bytes) per thread per step
        for (int idx = threadIdx.x; idx < TILE * KSTEP / 8; idx += blockDim.x) {
            const int row = idx / (KSTEP / 8), col = (idx % (KSTEP / 8)) * 8;
            *reinterpret_cast<int4*>(&sa[row * (KSTEP + PAD) + col]) =
                *reinterpret_cast<const int4*>(&a[(size_t)(tile_m * TILE + row) * k + k0 + col]);
            *reinterpret_cast<int4*>(&sb[row * (KSTEP + PAD) + col]) =
                *reinterpret_cast<const int4*>(&bt[(size_t)(tile_n * TILE + row) * k + k0 + col]);
        }
        __syncthreads();
        for (int kk = 0; kk < KSTEP; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[4];
            for (int i = 0; i < 2; ++i)
                wmma::load_matrix_sync(fa[i], &sa[(wr * 32 + i * 16) * (KSTEP + PAD) + kk], KSTEP + PAD);
            for (int j = 0; j < 4; ++j)
                wmma::load_matrix_sync(fb[j], &sb[(wc * 64 + j * 16) * (KSTEP + PAD) + kk], KSTEP + PAD);
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 4; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) {
            float* out = &c[(size_t)(tile_m * TILE + wr * 32 + i * 16) * n + tile_n * TILE + wc * 64 + j * 16];
            wmma::store_matrix_sync(out, acc[i][j], n, wmma::mem_row_major);
        }
}
