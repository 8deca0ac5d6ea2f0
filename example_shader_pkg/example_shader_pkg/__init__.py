"""example-shader-pkg: a shader package built by hatch-khal.

Five crates are compiled at wheel-build time and embedded here:

* ``core``: ``saxpy``, ``reduce_sum``, ``gelu``, ``gelu_tanh``,
  ``histogram_digits``, ``exclusive_scan``, ``scatter_digits``;
* ``particles``: ``integrate``, ``collide_ground``, ``count_active``,
  ``compact_alive``, ``kinetic_energy``;
* ``cccl``: ``bias_gelu_bf16`` (cuda_bf16.h), ``sum_cub`` (cub::BlockReduce),
  ``sort_tiles`` (cub::BlockRadixSort), ``tile_max`` (cooperative groups) — built
  against the CUDA header wheels the hook adds to the build;
* ``slang`` (Slang, ``kernels/slang/*.slang``): ``saxpy_shared``, ``sum_u32``,
  ``histogram256``, ``affine`` and the particle step ``slang_integrate``,
  ``slang_collide_ground``, ``slang_count_active``, ``slang_compact_alive``,
  ``slang_kinetic_energy`` — built for CUDA and as WGSL / SPIR-V for WebGPU
  (``slang_reference`` holds their NumPy references).

* ``tutorials`` (Triton, ``triton_kernels/tutorials.py``, Triton's tutorials 01-03): ``add_kernel``,
  ``softmax_kernel``, ``matmul_kernel``, in the variants of ``khal-triton.lock`` (recorded from
  ``record_warmup.py``) — compiled by Triton at build time, launched without Triton.
  ``example_shader_pkg.tutorials`` (torch functions) calls them as Triton code does,
  ``add_kernel[grid](x, y, out, n, BLOCK_SIZE=1024)``: importing this package makes the kernels of
  ``triton_kernels.tutorials`` the wheel's; ``kernels.add_kernel`` is the same call.

``kernels`` holds every entry point, e.g.
``kernels.saxpy(elementwise_threads(n), x, y, SaxpyParams(a=2.0))``; the
first argument is a thread count, and every kernel is correct for any count
(see each helper below for the fast one).
``reference`` has a NumPy reference for each kernel.
"""

from __future__ import annotations

# the build writes _khal/ (the manifest, the kernels' binaries and a typed module loading them):
# `kernels` is typed for mypy and pyright from _khal/__init__.pyi
from ._khal import kernels
from .structs import PARTICLE_DTYPE, Particle, SaxpyParams, SimParams

__all__ = [
    "kernels",
    "SaxpyParams",
    "SimParams",
    "Particle",
    "PARTICLE_DTYPE",
    "elementwise_threads",
    "reduce_sum_threads",
    "EXCLUSIVE_SCAN_THREADS",
    "SORT_TILE",
    "sort_tiles_threads",
]

#: Thread count that runs ``exclusive_scan``: it works in one group of 1024.
EXCLUSIVE_SCAN_THREADS = 1024


def elementwise_threads(n: int) -> int:
    """Thread count for ``saxpy``, ``gelu`` and ``gelu_tanh`` over ``n`` elements.

    Any count >= 1 is correct; ``ceil(n / 4)`` lets every thread move a float4,
    which is what reaches copy bandwidth (``n`` threads gets about 80% of it).
    """
    return max(1, (int(n) + 3) // 4)


def reduce_sum_threads(n: int) -> int:
    """A good thread count for ``reduce_sum`` over ``n`` floats.

    The kernel is correct for any count >= 1 and never uses more than 1024
    groups of 256; this launches at most that many, each thread reading at
    least one float4.
    """
    return max(1, min((int(n) + 3) // 4, 1 << 18))


#: Keys sorted together by ``sort_tiles``: one group of 128 threads x 4 keys.
SORT_TILE = 512


def sort_tiles_threads(n: int) -> int:
    """Thread count for ``sort_tiles`` over ``n`` keys: one 128-thread group per tile."""
    return max(1, -(-int(n) // SORT_TILE)) * 128

