"""Host mirrors of the kernels' structs (kernels/include/params.cuh, particles.cuh).

Each ``ctypes.Structure`` matches its C struct field for field (same order,
same C types), so an instance can be passed as a uniform. ``PARTICLE_DTYPE`` is
the NumPy view of the ``Particle`` storage element.
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["SaxpyParams", "SimParams", "Particle", "PARTICLE_DTYPE"]


class SaxpyParams(ctypes.Structure):
    """``struct SaxpyParams { float a; }`` (4 bytes)."""

    _fields_ = [("a", ctypes.c_float)]


class SimParams(ctypes.Structure):
    """``struct SimParams { float dt; float gravity; float restitution; uint32_t n; }`` (16 bytes)."""

    _fields_ = [
        ("dt", ctypes.c_float),
        ("gravity", ctypes.c_float),
        ("restitution", ctypes.c_float),
        ("n", ctypes.c_uint32),
    ]


class Particle(ctypes.Structure):
    """``struct Particle`` (32 bytes): position, life, velocity, mass."""

    _fields_ = [
        ("px", ctypes.c_float),
        ("py", ctypes.c_float),
        ("pz", ctypes.c_float),
        ("life", ctypes.c_float),
        ("vx", ctypes.c_float),
        ("vy", ctypes.c_float),
        ("vz", ctypes.c_float),
        ("mass", ctypes.c_float),
    ]


PARTICLE_DTYPE = np.dtype([(name, np.float32) for name, _ in Particle._fields_])

assert ctypes.sizeof(SaxpyParams) == 4
assert ctypes.sizeof(SimParams) == 16
assert ctypes.sizeof(Particle) == PARTICLE_DTYPE.itemsize == 32
