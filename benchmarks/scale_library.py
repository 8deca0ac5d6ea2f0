"""A synthetic kernel library for the scale benchmark (issue #39): templates x dtypes x tile sizes.

``write_library(root, templates=3, dtypes=4, tiles=4, archs=[...])`` writes a project of
``templates * dtypes`` crates (one source file each: one template, one dtype, as libraries such as
FlashInfer put an instantiation family in a translation unit), each instantiating its template for
``tiles`` tile sizes: ``templates * dtypes * tiles`` instantiations, compiled for every arch in
``archs``. The kernels are the shapes such libraries are made of, at realistic sizes (a few hundred
to a few thousand SASS instructions each once unrolled): a shared-memory tiled GEMM with a float
accumulator, a row softmax with warp shuffles, a fused bias + GELU with vectorised loads. Half and
bfloat16 come from ``cuda_fp16.h`` / ``cuda_bf16.h``, so every unit includes the CUDA headers, as
real libraries do.

    python benchmarks/scale_library.py OUT --templates 3 --dtypes 4 --tiles 4 --archs sm_80,sm_90
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

DTYPES = [("f32", "float"), ("f16", "__half"), ("bf16", "__nv_bfloat16"), ("f64", "double")]
TILES = [1, 2, 4, 8, 16, 32]

PRELUDE = """\
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template <typename T> __device__ __forceinline__ float to_f(T v) { return static_cast<float>(v); }
template <typename T> __device__ __forceinline__ T from_f(float v) { return T(v); }
"""

TEMPLATES = {
    # C[i, j] = sum_k A[i, k] B[k, j]: 16x16 threads, each computing TILE outputs along j, K in tiles of 16
    "gemm": """\
template <typename T, int TILE>
KHAL_ENTRY(gemm, 256, (KHAL_STORAGE(const T, a), KHAL_STORAGE(const T, b), KHAL_STORAGE(T, c),
                      KHAL_SCALAR(uint32_t, m), KHAL_SCALAR(uint32_t, n), KHAL_SCALAR(uint32_t, k)))
{
    __shared__ float as[16][17];
    __shared__ float bs[16][16 * TILE + 1];
    const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const uint32_t row = blockIdx.y * 16 + ty, col0 = blockIdx.x * 16 * TILE + tx;
    float acc[TILE];
#pragma unroll
    for (int t = 0; t < TILE; ++t) acc[t] = 0.0f;
    for (uint32_t k0 = 0; k0 < k; k0 += 16) {
        as[ty][tx] = (row < m && k0 + tx < k) ? to_f(a[(uint64_t)row * k + k0 + tx]) : 0.0f;
#pragma unroll
        for (int t = 0; t < TILE; ++t) {
            uint32_t col = col0 + t * 16;
            bs[ty][tx + t * 16] = (k0 + ty < k && col < n) ? to_f(b[(uint64_t)(k0 + ty) * n + col]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; ++kk) {
            float av = as[ty][kk];
#pragma unroll
            for (int t = 0; t < TILE; ++t) acc[t] = fmaf(av, bs[kk][tx + t * 16], acc[t]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int t = 0; t < TILE; ++t) {
        uint32_t col = col0 + t * 16;
        if (row < m && col < n) c[(uint64_t)row * n + col] = from_f<T>(acc[t]);
    }
}
""",
    # y = softmax(x) per row: a block per row, VEC elements per thread per step, warp shuffles
    "softmax": """\
template <typename T, int VEC>
KHAL_ENTRY(softmax, 256, (KHAL_STORAGE(const T, x), KHAL_STORAGE(T, y), KHAL_SCALAR(uint32_t, cols)))
{
    __shared__ float red[8];
    const uint64_t base = (uint64_t)blockIdx.x * cols;
    float mx = -3.402823466e38f;
    for (uint32_t c = threadIdx.x * VEC; c < cols; c += 256 * VEC) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) if (c + v < cols) mx = fmaxf(mx, to_f(x[base + c + v]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = red[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0.0f;
    for (uint32_t c = threadIdx.x * VEC; c < cols; c += 256 * VEC) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) if (c + v < cols) sum += __expf(to_f(x[base + c + v]) - mx);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
    __syncthreads();
    sum = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) sum += red[w];
    const float inv = 1.0f / sum;
    for (uint32_t c = threadIdx.x * VEC; c < cols; c += 256 * VEC) {
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            if (c + v < cols) y[base + c + v] = from_f<T>(__expf(to_f(x[base + c + v]) - mx) * inv);
    }
}
""",
    # out = gelu(x + bias[col]) * scale, UNROLL elements per thread
    "bias_gelu": """\
template <typename T, int UNROLL>
KHAL_ENTRY(bias_gelu, 128, (KHAL_STORAGE(const T, x), KHAL_STORAGE(const T, bias), KHAL_STORAGE(T, out),
                           KHAL_SCALAR(uint32_t, cols), KHAL_SCALAR(float, scale)))
{
    const uint64_t i0 = KHAL_GLOBAL_ID * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        uint64_t i = i0 + u;
        if (i < x.len) {
            float v = to_f(x[i]) + to_f(bias[i % cols]);
            float g = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
            out[i] = from_f<T>(g * scale);
        }
    }
}
""",
}


def write_library(root: Path, *, templates: int = 3, dtypes: int = 4, tiles: int = 4,
                  archs: list[str] | None = None, ptx_arch: str = "none", name: str = "scale-lib") -> int:
    """Write the project; the number of instantiations."""
    archs = archs or ["sm_80", "sm_90"]
    pkg = name.replace("-", "_")
    (root / pkg).mkdir(parents=True, exist_ok=True)
    (root / pkg / "__init__.py").write_text("import khal_runtime\nkernels = khal_runtime.load(__name__)\n")
    crates = []
    count = 0
    for tname in list(TEMPLATES)[:templates]:
        for short, ctype in DTYPES[:dtypes]:
            crate = f"{tname}_{short}"
            lines = [PRELUDE, TEMPLATES[tname]]
            for tile in TILES[:tiles]:
                lines.append(f"KHAL_INSTANTIATE({tname}, {tname}_{short}_t{tile}, {ctype}, {tile})")
                count += 1
            src = root / "kernels" / crate / f"{crate}.cu"
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text("\n".join(lines) + "\n")
            crates.append(f'[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "{crate}"\n'
                          f'sources = ["kernels/{crate}/*.cu"]\n')
    arch_list = ", ".join(f'"{a}"' for a in archs)
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["hatchling>=1.24", "hatch-khal"]
        build-backend = "hatchling.build"

        [project]
        name = "{name}"
        version = "0.1.0"
        requires-python = ">=3.10"
        dependencies = ["khal-runtime>=0.1.0"]

        [tool.hatch.build.targets.wheel]
        packages = ["{pkg}"]

        [tool.hatch.build.targets.wheel.hooks.khal]
        archs = [{arch_list}]
        ptx-arch = "{ptx_arch}"

        """) + "\n".join(crates))
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--templates", type=int, default=3)
    ap.add_argument("--dtypes", type=int, default=4)
    ap.add_argument("--tiles", type=int, default=4)
    ap.add_argument("--archs", default="sm_80,sm_90")
    args = ap.parse_args()
    n = write_library(args.out, templates=args.templates, dtypes=args.dtypes, tiles=args.tiles,
                      archs=args.archs.split(","))
    print(f"{n} instantiations in {args.templates * args.dtypes} crates, archs {args.archs}: {args.out}")


if __name__ == "__main__":
    main()
