"""NumPy references for every kernel of example-shader-pkg, and test helpers.

Element-wise kernels are compared with float32 tolerances; sums are computed
in float64 and compared with :func:`sum_tolerance` (the GPU adds in float32 in
an order set by the launch). The particle step is written without FMA
contraction on the GPU, so :func:`integrate` and :func:`collide_ground` match
it bit for bit. Functions never modify their inputs.
"""

from __future__ import annotations

import math

import numpy as np

from .structs import PARTICLE_DTYPE, SimParams

__all__ = [
    "RADIX_BINS",
    "saxpy",
    "reduce_sum",
    "sum_tolerance",
    "gelu",
    "gelu_tanh",
    "digits",
    "histogram_digits",
    "exclusive_scan",
    "scatter_digits",
    "assert_same_buckets",
    "make_keys",
    "make_particles",
    "integrate",
    "collide_ground",
    "count_active",
    "compact_alive",
    "kinetic_energy",
]

RADIX_BINS = 256

# ---------------------------------------------------------------- core crate


def saxpy(x: np.ndarray, y: np.ndarray, a: float) -> np.ndarray:
    """``y = a * x + y`` as the GPU computes it (one fused multiply-add)."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    n = min(x.size, y.size)
    out = y.copy()
    a32 = np.float64(np.float32(a))
    out[:n] = (a32 * x[:n].astype(np.float64) + y[:n].astype(np.float64)).astype(np.float32)
    return out


def reduce_sum(x: np.ndarray) -> float:
    """Exact-ish sum (float64) of a float32 array."""
    return float(np.sum(np.asarray(x, np.float32), dtype=np.float64))


def sum_tolerance(x: np.ndarray, *, rtol: float = 1e-5) -> float:
    """Absolute tolerance for a float32 GPU sum of ``x`` against :func:`reduce_sum`.

    A float32 sum in any order is within about ``n * eps * sum(|x|)`` of the
    exact one; tree and strided orders do far better, so ``rtol * sum(|x|)``
    (plus a floor) is both safe and tight.
    """
    x = np.asarray(x, np.float32)
    return rtol * float(np.sum(np.abs(x), dtype=np.float64)) + 1e-6


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """``0.5 x (1 + erf(x / sqrt(2)))``, computed in float64, returned as float32."""
    x64 = np.asarray(x, np.float32).astype(np.float64)
    erf = _erf(x64 / math.sqrt(2.0)).astype(np.float64)
    return (0.5 * x64 * (1.0 + erf)).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` in float64, as float32."""
    x64 = np.asarray(x, np.float32).astype(np.float64)
    inner = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)
    return (0.5 * x64 * (1.0 + np.tanh(inner))).astype(np.float32)


def digits(keys: np.ndarray, shift: int) -> np.ndarray:
    """The 8-bit digit ``(key >> shift) & 255`` of each uint32 key."""
    keys = np.asarray(keys, np.uint32)
    return ((keys >> np.uint32(shift & 31)) & np.uint32(RADIX_BINS - 1)).astype(np.uint32)


def histogram_digits(keys: np.ndarray, shift: int, hist: np.ndarray | None = None) -> np.ndarray:
    """``hist + bincount(digits)`` (uint32, 256 bins); ``hist`` defaults to zeros."""
    counts = np.bincount(digits(keys, shift), minlength=RADIX_BINS).astype(np.uint64)
    if hist is not None:
        counts = counts + np.asarray(hist, np.uint32).astype(np.uint64)
    return (counts & 0xFFFFFFFF).astype(np.uint32)


def exclusive_scan(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Exclusive prefix sum with uint32 wrap-around, and the (wrapped) total."""
    v = np.asarray(values, np.uint32)
    inclusive = np.cumsum(v, dtype=np.uint32)  # wraps modulo 2**32
    out = np.empty_like(v)
    if v.size:
        out[0] = 0
        out[1:] = inclusive[:-1]
        total = int(inclusive[-1])
    else:
        total = 0
    return out, total


def scatter_digits(
    keys: np.ndarray, offsets: np.ndarray, shift: int, out_len: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Stable bucketing of ``keys`` by digit starting at ``offsets``.

    Returns ``(out, offsets_after)``: ``out[offsets[d] + j]`` is the j-th key of
    digit ``d`` (slots not written hold 0), ``offsets_after = offsets + counts``.
    The GPU pass is not stable across warps: compare with
    :func:`assert_same_buckets`, not element-wise.
    """
    keys = np.asarray(keys, np.uint32)
    offsets = np.asarray(offsets, np.uint32)
    n_out = keys.size if out_len is None else int(out_len)
    d = digits(keys, shift)
    order = np.argsort(d, kind="stable")
    sorted_keys, sorted_d = keys[order], d[order]
    counts = np.bincount(d, minlength=RADIX_BINS)
    starts_in_sorted = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(keys.size) - starts_in_sorted[sorted_d]
    slots = offsets.astype(np.int64)[sorted_d] + rank
    out = np.zeros(n_out, np.uint32)
    keep = slots < n_out
    out[slots[keep]] = sorted_keys[keep]
    after = ((offsets.astype(np.uint64) + counts.astype(np.uint64)) & 0xFFFFFFFF).astype(np.uint32)
    return out, after


def assert_same_buckets(got: np.ndarray, expected: np.ndarray, shift: int) -> None:
    """``got`` holds the same keys as ``expected`` and every slot the same digit.

    Together these say ``got`` is a valid (possibly unstable) scatter: each
    bucket's range holds exactly that bucket's keys, in some order.
    """
    got = np.asarray(got, np.uint32)
    expected = np.asarray(expected, np.uint32)
    if got.shape != expected.shape:
        raise AssertionError(f"shape {got.shape} != {expected.shape}")
    bad = np.flatnonzero(digits(got, shift) != digits(expected, shift))
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{bad.size} slots in the wrong bucket, first at {i}: "
            f"got {int(got[i]):#010x}, expected digit {int(digits(expected[i:i + 1], shift)[0])}"
        )
    if not np.array_equal(np.sort(got), np.sort(expected)):
        raise AssertionError("the scattered keys are not a permutation of the input keys")


def make_keys(n: int, seed: int = 0) -> np.ndarray:
    """Random uint32 keys over the full range."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, size=n, dtype=np.uint32)


# ----------------------------------------------------------- particles crate


def make_particles(n: int, seed: int = 0, *, dead_fraction: float = 0.25) -> np.ndarray:
    """``n`` random particles (``PARTICLE_DTYPE``): some below ground, some dead."""
    rng = np.random.default_rng(seed)
    p = np.zeros(n, PARTICLE_DTYPE)
    p["px"] = rng.uniform(-10, 10, n)
    p["py"] = rng.uniform(-1, 10, n)
    p["pz"] = rng.uniform(-10, 10, n)
    p["vx"] = rng.normal(0, 2, n)
    p["vy"] = rng.normal(0, 5, n)
    p["vz"] = rng.normal(0, 2, n)
    p["mass"] = rng.uniform(0.5, 2.0, n)
    life = rng.uniform(0.0, 5.0, n).astype(np.float32)
    dead = rng.random(n) < dead_fraction
    life[dead] = -rng.uniform(0.0, 1.0, int(dead.sum()))
    p["life"] = life
    return p


def _count(params: SimParams, particles: np.ndarray) -> int:
    return min(int(params.n), particles.size)


def integrate(particles: np.ndarray, params: SimParams) -> np.ndarray:
    """Semi-implicit Euler step of the alive particles among the first ``params.n``."""
    p = np.array(particles, PARTICLE_DTYPE, copy=True)
    head = p[: _count(params, p)]
    alive = head["life"] > np.float32(0)
    dt = np.float32(params.dt)
    dv = np.float32(params.gravity) * dt
    q = head[alive]
    q["vy"] = q["vy"] + dv
    q["px"] = q["px"] + q["vx"] * dt
    q["py"] = q["py"] + q["vy"] * dt
    q["pz"] = q["pz"] + q["vz"] * dt
    q["life"] = q["life"] - dt
    head[alive] = q
    return p


def collide_ground(particles: np.ndarray, params: SimParams) -> np.ndarray:
    """Bounce alive particles below ``y = 0`` with the restitution."""
    p = np.array(particles, PARTICLE_DTYPE, copy=True)
    head = p[: _count(params, p)]
    e = np.float32(params.restitution)
    hit = (head["life"] > np.float32(0)) & (head["py"] < np.float32(0))
    q = head[hit]
    q["py"] = -q["py"] * e
    down = q["vy"] < np.float32(0)
    q["vy"] = np.where(down, -q["vy"] * e, q["vy"]).astype(np.float32)
    head[hit] = q
    return p


def count_active(particles: np.ndarray, params: SimParams) -> int:
    """Number of alive particles (``life > 0``) among the first ``params.n``."""
    head = np.asarray(particles)[: _count(params, particles)]
    return int(np.count_nonzero(head["life"] > np.float32(0)))


def compact_alive(particles: np.ndarray, params: SimParams) -> np.ndarray:
    """Indices of the alive particles, ascending (the GPU's order differs: sort it)."""
    head = np.asarray(particles)[: _count(params, particles)]
    return np.flatnonzero(head["life"] > np.float32(0)).astype(np.uint32)


def kinetic_energy(particles: np.ndarray, indices: np.ndarray) -> float:
    """``sum 0.5 m |v|^2`` over ``particles[indices]`` (float64); indices out of range are skipped."""
    p = np.asarray(particles)
    idx = np.asarray(indices, np.int64)
    idx = idx[idx < p.size]
    q = p[idx]
    v2 = (
        q["vx"].astype(np.float64) ** 2
        + q["vy"].astype(np.float64) ** 2
        + q["vz"].astype(np.float64) ** 2
    )
    return float(np.sum(0.5 * q["mass"].astype(np.float64) * v2))


# ------------------------------------------------------------------ cccl crate


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def bias_gelu_bf16(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """gelu(x + bias[col]) with bf16 inputs, float math, bf16 output (as float32 values).

    ``x`` is (rows, cols) or flat with ``len(bias)`` columns; inputs are taken as
    already bf16-representable float32 values.
    """
    cols = bias.shape[0]
    flat = np.asarray(x, dtype=np.float32).reshape(-1)
    v = flat + np.tile(np.asarray(bias, dtype=np.float32), -(-flat.size // cols))[: flat.size]
    return bf16_round(gelu(v.astype(np.float32)))


def sum_cub(x: np.ndarray) -> float:
    return reduce_sum(x)


def sort_tiles(keys: np.ndarray, tile: int = 512) -> np.ndarray:
    """Each tile of ``tile`` consecutive keys sorted ascending (the last may be partial)."""
    out = np.array(keys, dtype=np.uint32, copy=True)
    for start in range(0, out.size, tile):
        out[start : start + tile].sort()
    return out


def tile_max(x: np.ndarray, tile: int = 32) -> np.ndarray:
    """max over each tile of 32 consecutive elements (the last may be partial)."""
    x = np.asarray(x, dtype=np.float32)
    pad = (-x.size) % tile
    padded = np.concatenate([x, np.full(pad, -np.inf, dtype=np.float32)])
    return padded.reshape(-1, tile).max(axis=1)
