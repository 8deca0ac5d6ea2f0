"""The NVIDIA wheels that NVRTC and the CUDA headers come from, by CUDA major version.

Two naming schemes are on PyPI, and they install differently (checked in the wheels
nvidia-cuda-nvrtc 13.5.37 and nvidia-cuda-nvrtc-cu12 12.9.86, -runtime-cu12 12.9.79,
-cccl-cu12 12.9.27):

* CUDA 13 and later: one name per component, no suffix (``nvidia-cuda-nvrtc`` 13.x), installed
  under ``nvidia/cu13/``: ``lib/libnvrtc.so.13``, ``include/`` (runtime headers and ``crt/``, the
  latter from ``nvidia-cuda-crt``), ``include/cccl/`` (``nvidia-cuda-cccl``, numbered on its own);
* CUDA 12: ``-cu12`` names (``nvidia-cuda-nvrtc-cu12`` 12.x), each in a folder of its own:
  ``nvidia/cuda_nvrtc/lib/libnvrtc.so.12``, ``nvidia/cuda_runtime/include/``,
  ``nvidia/cuda_cccl/include/`` (CCCL at its top, numbered like CUDA). There is no crt wheel:
  NVRTC 12 compiles ``cuda_runtime.h`` and friends without one.

The patch numbers of one CUDA release differ between its wheels (runtime-cu12 12.9.79 beside
nvrtc-cu12 12.9.86), so the header wheels follow NVRTC's requirement to the minor version only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

__all__ = ["FAMILIES", "Family", "admitted_majors", "family_for_major", "header_spec", "library_major",
           "parse_nvrtc_requirement"]

#: majors above this are never probed (an open upper bound reads as "up to here")
_TOP = 40


@dataclass(frozen=True)
class Family:
    """NVRTC and its header wheels under one naming scheme."""

    #: the NVRTC distribution
    nvrtc: str
    #: the CUDA majors released under these names: ``range(lo, hi)``
    lo: int
    hi: int
    #: the runtime headers' wheel (cuda_fp16.h, cooperative_groups.h, ...)
    runtime: str
    #: the ``crt/`` headers' wheel, if the scheme has one
    crt: str | None
    #: CCCL (CUB, Thrust, libcu++)
    cccl: str
    #: whether CCCL's versions follow CUDA's (cu12) or its own numbering (CUDA 13 and later)
    cccl_follows_cuda: bool
    #: NVRTC's shared library, globbed under each sys.path entry
    library_globs: tuple[str, ...]

    @property
    def header_packages(self) -> tuple[str, ...]:
        return (self.runtime,) + ((self.crt,) if self.crt else ()) + (self.cccl,)

    def include_subdirs(self, lib: str, major: int) -> tuple[str, ...]:
        """Where, under a site-packages folder, ``lib`` ("cudart" or "cccl") puts its headers."""
        if self.cccl_follows_cuda:  # cu12: a folder per wheel
            return ("nvidia/cuda_cccl/include",) if lib == "cccl" else ("nvidia/cuda_runtime/include",)
        return (f"nvidia/cu{major}/include/cccl",) if lib == "cccl" else (f"nvidia/cu{major}/include",)

    def describe(self) -> str:
        what = f"CUDA {self.lo}" if self.hi == self.lo + 1 else f"CUDA {self.lo} and later"
        return f"{self.nvrtc} ({what})"


FAMILIES = (
    Family("nvidia-cuda-nvrtc", 13, _TOP, "nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl", False,
           ("nvidia/cu*/lib/libnvrtc.so.*", "nvidia/cu*/bin/nvrtc64_*.dll")),
    Family("nvidia-cuda-nvrtc-cu12", 12, 13, "nvidia-cuda-runtime-cu12", None, "nvidia-cuda-cccl-cu12", True,
           ("nvidia/cuda_nvrtc/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/bin/nvrtc64_*.dll")),
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def family_of(name: str) -> Family | None:
    return next((f for f in FAMILIES if f.nvrtc == _norm(name)), None)


def family_for_major(major: int) -> Family | None:
    return next((f for f in FAMILIES if f.lo <= major < f.hi), None)


def admitted_majors(spec: SpecifierSet, lo: int = 12, hi: int = _TOP) -> list[int]:
    """The CUDA majors in ``range(lo, hi)`` with a version the specifier admits (probed at
    minors 0-19, patches 0 and 999, and at the versions the specifier names)."""
    named = [sp.version.removesuffix(".*") for sp in spec]

    def probes(m: int) -> list[str]:
        return [f"{m}.{n}.{p}" for n in range(20) for p in (0, 999)] + [v for v in named if _minor(v)[0] == m]

    return [m for m in range(lo, hi) if any(spec.contains(v, prereleases=True) for v in probes(m))]


def parse_nvrtc_requirement(text: str) -> tuple[Requirement, Family]:
    """The requirement and its family; ValueError saying what is wrong (the config model turns
    it into a ConfigError naming the option)."""
    from packaging.requirements import InvalidRequirement, Requirement  # lazy: only when validating

    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"{text!r} is not a valid requirement ({exc})") from None
    fam = family_of(req.name)
    if fam is None:
        known = " or ".join(f.describe() for f in FAMILIES)
        raise ValueError(f"must be a requirement on {known}, got {req.name!r}")
    if not admitted_majors(req.specifier, fam.lo, fam.hi):
        other = next((f for f in FAMILIES if f is not fam and admitted_majors(req.specifier, f.lo, f.hi)), None)
        hint = f"; for that, require {other.nvrtc}{req.specifier}" if other else ""
        raise ValueError(f"{text!r} admits no release of {fam.describe()}{hint}")
    return req, fam


def _minor(v: str) -> tuple[int, int, bool]:
    """(major, minor, whether anything past the minor is non-zero) of a version string."""
    parts = [int(p) for p in re.findall(r"\d+", v.split("+")[0])[:4]] + [0, 0]
    return parts[0], parts[1], any(parts[2:])


def header_spec(spec: SpecifierSet) -> str:
    """NVRTC's specifier at the minor-version level, for the header wheels of the same CUDA
    release (their patch numbers differ from NVRTC's): ``==12.9.86`` -> ``==12.9.*``,
    ``>=12.4.1`` -> ``>=12.4``, ``<12.8.5`` -> ``<12.9``; ``~=13.0.0``, ``>=12.8``, ``~=12.9``
    stay as they are."""
    out: list[str] = []
    for sp in sorted(spec, key=str):
        op, v = sp.operator, sp.version
        if v.endswith(".*"):
            out.append(str(sp))
            continue
        major, minor, past = _minor(v)
        long = v.count(".") >= 2
        if op in ("==", "===") or (op == "~=" and long and past):
            out.append(f"=={major}.{minor}.*")
        elif op in (">=", ">") and long:
            out.append(f">={major}.{minor}")
        elif op in ("<", "<=") and long and (past or op == "<="):
            out.append(f"<{major}.{minor + 1}")
        elif op == "!=" and long:
            continue  # one excluded NVRTC patch excludes no header release
        else:
            out.append(str(sp))
    return ",".join(out)


def library_major(filename: str) -> int | None:
    """The CUDA major of an NVRTC library file: ``libnvrtc.so.12`` -> 12, ``nvrtc64_130_0.dll`` -> 13."""
    m = re.search(r"\.so\.(\d+)", filename) or re.search(r"nvrtc64_(\d+)\d_", filename)
    return int(m.group(1)) if m else None
