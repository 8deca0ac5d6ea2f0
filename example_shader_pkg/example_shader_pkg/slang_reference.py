"""NumPy references for the Slang kernels of example-shader-pkg (``kernels/slang/*.slang``).

The Slang crate is built for CUDA with ``--fmad=false`` and written without fused operations, so
the float32 references below (one rounding per operation, in the kernels' order) match CUDA bit
for bit; WebGPU drivers may contract ``a*b+c`` themselves, so compare those with a few ulps.
Integer kernels are exact everywhere. The particle step reuses :mod:`.reference` (same semantics
as the CUDA crate), except the kinetic energy, which the Slang kernel sums per group
(:func:`kinetic_energy_partials`). Functions never modify their inputs.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .reference import collide_ground, compact_alive, count_active, histogram_digits, integrate
from .reference import kinetic_energy as kinetic_energy_total

__all__ = [
    "Affine",
    "PARTICLE_GROUP",
    "affine",
    "collide_ground",
    "compact_alive",
    "count_active",
    "histogram256",
    "integrate",
    "kinetic_energy_partials",
    "kinetic_energy_total",
    "WEBGPU_ULPS",
    "matches",
    "saxpy_shared",
    "sum_u32",
    "ulp_distance",
]

#: threads per group of the Slang particle entries
PARTICLE_GROUP = 128

#: how far (float32 ulps) a WebGPU result may be from these references: WebGPU's shader compilers
#: may contract ``a * b + c`` into one FMA (one rounding less), e.g. NVIDIA's Vulkan driver does
#: for saxpy; lavapipe does not. CUDA builds use ``--fmad=false``: compare those bit for bit.
WEBGPU_ULPS = 4


def ulp_distance(got: np.ndarray, want: np.ndarray) -> int:
    """The largest distance in float32 ulps between two float32 arrays (or arrays of float32
    records, such as particles), element by element; shapes must agree."""
    a = np.ascontiguousarray(got).view(np.int32).astype(np.int64).ravel()
    b = np.ascontiguousarray(want).view(np.int32).astype(np.int64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {np.shape(got)} vs {np.shape(want)}")
    # float bit patterns ordered as integers (negative floats count down from zero)
    a = np.where(a < 0, -(a & 0x7FFFFFFF), a)
    b = np.where(b < 0, -(b & 0x7FFFFFFF), b)
    return int(np.max(np.abs(a - b))) if a.size else 0


def matches(got: np.ndarray, want: np.ndarray, ulps: int = 0) -> bool:
    """``got`` equals ``want`` bit for bit (``ulps=0``), or (floats, and float fields of records)
    each value within ``ulps`` ulps **of the array's largest magnitude** (at least 1.0): fusing ``a*b+c`` moves a
    result by up to an ulp of the product, which cancellation can make many ulps of the result
    itself, so a per-value ulp distance would reject correct FMA results. Pass
    :data:`WEBGPU_ULPS` for WebGPU results."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if ulps == 0:
        return got.tobytes() == want.tobytes()
    if want.dtype.names:  # records (particles...): float fields within ulps, the rest exact
        return all(matches(got[name], want[name], ulps) for name in want.dtype.names)
    if want.dtype.kind != "f":
        return got.tobytes() == want.tobytes()
    eps = float(np.finfo(want.dtype).eps)
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
    return bool(np.all(np.abs(g - w) <= ulps * eps * scale))


def saxpy_shared(x: np.ndarray, y: np.ndarray, a: float) -> np.ndarray:
    """``y = a * x + y`` over the common length, rounded after the multiply and after the add."""
    x = np.asarray(x, np.float32)
    out = np.array(y, np.float32, copy=True)
    n = min(x.size, out.size)
    out[:n] = (np.float32(a) * x[:n]).astype(np.float32) + out[:n]
    return out


def sum_u32(values: np.ndarray, total: int = 0) -> int:
    """``total + sum(values)`` modulo 2**32 (the kernel adds into ``total[0]``)."""
    return int((int(np.sum(np.asarray(values, np.uint32), dtype=np.uint64)) + int(total)) & 0xFFFFFFFF)


def histogram256(keys: np.ndarray, shift: int, bins: np.ndarray | None = None) -> np.ndarray:
    """``bins + bincount((keys >> (shift & 31)) & 255)`` as uint32 (256 bins)."""
    return histogram_digits(keys, shift, bins)


class Affine(ctypes.Structure):
    """``struct Affine`` of kernels/slang/affine.slang in its **CUDA** layout (48 bytes).

    WGSL / SPIR-V lay it out in 80 bytes (std140: ``taps`` steps 16 bytes and starts at 48): the
    host packs per target from the manifest's ``Param.layouts``, not from this class."""

    _fields_ = [
        ("scale", ctypes.c_float * 4),
        ("shift", ctypes.c_float * 3),
        ("bias", ctypes.c_float),
        ("step", ctypes.c_int32),
        ("mask", ctypes.c_uint32),
        ("taps", ctypes.c_float * 2),
    ]


def affine(x: np.ndarray, p: Affine, gain: float, base: int, count: int,
           y: np.ndarray | None = None, k: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(y, k)`` after the ``affine`` kernel; ``y`` / ``k`` default to zeros of len(x).

    For i < min(count, len(x), len(y), len(k)), in float32 with one rounding per operation::

        v = x[i] * scale[i % 4] + shift[i % 3] + bias + taps[0] * x[i-1] + taps[1] * x[i+1]
        y[i] = gain * v;   k[i] = (base + i * step) & mask   (int32, wrapping)
    """
    f32 = np.float32
    x = np.asarray(x, f32)
    y = np.zeros(x.size, f32) if y is None else np.array(y, f32, copy=True)
    k = np.zeros(x.size, np.int32) if k is None else np.array(k, np.int32, copy=True)
    n = min(int(count), x.size, y.size, k.size)
    i = np.arange(n)
    left = np.where(i > 0, x[np.maximum(i - 1, 0)], f32(0)).astype(f32)
    right = np.where(i + 1 < x.size, x[np.minimum(i + 1, max(x.size - 1, 0))], f32(0)).astype(f32)
    scale = np.array(list(p.scale), f32)
    shift = np.array(list(p.shift), f32)
    v = (x[:n] * scale[i % 4]).astype(f32)
    v = (v + shift[i % 3]).astype(f32)
    v = (v + f32(p.bias)).astype(f32)
    v = (v + (f32(p.taps[0]) * left).astype(f32)).astype(f32)
    v = (v + (f32(p.taps[1]) * right).astype(f32)).astype(f32)
    y[:n] = (f32(gain) * v).astype(f32)
    ki = (np.int64(base) + i.astype(np.int64) * np.int64(p.step)) & np.int64(int(p.mask) & 0xFFFFFFFF)
    k[:n] = ((ki & 0xFFFFFFFF).astype(np.uint32)).view(np.int32)
    return y, k


def kinetic_energy_partials(particles: np.ndarray, indices: np.ndarray, alive_count: int | None = None,
                            groups: int | None = None) -> np.ndarray:
    """Per-group sums (float64) of ``0.5 m |v|^2`` over ``particles[indices[0:alive_count]]``, as
    ``slang_kinetic_energy`` writes them into ``partials`` (group g covers list positions
    ``[128 g, 128 g + 128)``; indices past the particles count 0). The kernel sums in float32 in
    a tree order: compare each with :func:`.reference.sum_tolerance`-like slack, or their total
    with :func:`kinetic_energy_total`."""
    p = np.asarray(particles)
    idx = np.asarray(indices, np.int64)
    n = idx.size if alive_count is None else min(int(alive_count), idx.size)
    groups = -(-n // PARTICLE_GROUP) if groups is None else int(groups)
    e = np.zeros(groups * PARTICLE_GROUP, np.float64)
    take = idx[:n]
    ok = take < p.size
    q = p[take[ok]]
    v2 = q["vx"].astype(np.float64) ** 2 + q["vy"].astype(np.float64) ** 2 + q["vz"].astype(np.float64) ** 2
    vals = np.zeros(n, np.float64)
    vals[ok] = 0.5 * q["mass"].astype(np.float64) * v2
    m = min(n, e.size)
    e[:m] = vals[:m]
    return e.reshape(groups, PARTICLE_GROUP).sum(axis=1)
