"""The CUDA headers a crate compiles against: from PyPI wheels, a toolkit, or none.

By default (``cuda-headers = "wheels"``) the headers come from the wheels the
hook adds to the build environment, matched to NVRTC's CUDA major:
``nvidia-cuda-runtime`` (cuda_fp16.h, cuda_bf16.h, cooperative_groups.h, ...),
``nvidia-cuda-crt`` (``crt/``) and ``nvidia-cuda-cccl`` (CUB, Thrust, libcu++),
located with cuda-pathfinder. ``"system"`` takes a toolkit's ``include`` folder
from ``CUDA_HOME`` / ``CUDA_PATH``; ``"none"`` adds nothing.

The headers are not hashed file by file (CCCL alone is thousands of files);
their package versions (or the toolkit's version file) are the fingerprint that
enters the hash of every crate that includes a system header.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from hatch_khal.compilers import get_compiler
from hatch_khal.errors import ConfigError, KhalBuildError

__all__ = ["HEADER_PACKAGES", "HeaderSet", "header_hint", "header_hints", "header_requirements", "nvrtc_cuda_major", "resolve_headers"]

#: The wheels that carry the CUDA headers (CUDA 13 naming: no -cuXX suffix).
HEADER_PACKAGES = ("nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl")


@dataclass(frozen=True)
class HeaderSet:
    mode: str
    include_dirs: tuple[Path, ...] = ()
    #: What identifies these headers in hashes and cache keys.
    fingerprint: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def header_requirements(nvrtc_requirement: str) -> list[str]:
    """Header wheels for the build environment, matched to NVRTC.

    ``nvidia-cuda-runtime`` and ``nvidia-cuda-crt`` are released with NVRTC and take
    its own version specifier (``~=13.0.0``, ``>=12.8``, ``==13.5.37``, ...); CCCL has
    its own release numbers, so it is pinned to NVRTC's CUDA major only.
    """
    from packaging.requirements import Requirement  # lazy: only the hook's dependencies() asks

    spec = Requirement(nvrtc_requirement).specifier
    pinned = sorted({int(sp.version.split(".")[0]) for sp in spec if sp.operator in ("==", "~=", "===")})
    majors = pinned or [
        m for m in range(12, 40) if any(spec.contains(f"{m}.{n}.0", prereleases=True) for n in range(10))
    ]
    if not majors:
        cccl = "nvidia-cuda-cccl"
    elif majors[-1] == 39:  # no upper bound
        cccl = f"nvidia-cuda-cccl>={max(majors[0], 13)}"
    else:
        cccl = f"nvidia-cuda-cccl>={max(majors[0], 13)},<{majors[-1] + 1}"
    return [f"nvidia-cuda-runtime{spec}", f"nvidia-cuda-crt{spec}", cccl]


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # lazy: only crates with CUDA headers

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _locate(lib: str, marker: str) -> Path | None:
    """A header folder from the wheels in this environment.

    sys.path first (an isolated build environment's packages are only there), then
    cuda-pathfinder, which searches the interpreter's site-packages.
    """

    for base in sys.path:
        if not base or not Path(base).is_dir():
            continue
        for inc in sorted(Path(base).glob("nvidia/cu*/include"), reverse=True):
            d = inc / "cccl" if lib == "cccl" else inc
            if (d / marker).is_file():
                return d
    try:
        # lazy: cuda-pathfinder only when the headers are not on sys.path
        from cuda.pathfinder import locate_nvidia_header_directory
    except ImportError:  # older cuda-pathfinder
        return None
    try:
        located = locate_nvidia_header_directory(lib)
    except Exception:  # pathfinder raises for setups it does not know
        return None
    if located is not None and located.found_via == "site-packages":
        return Path(located.abs_path)
    return None


@lru_cache(maxsize=None)
def _wheels(nvrtc_major: int | None) -> HeaderSet:
    dirs: list[Path] = []
    for lib, marker in (("cudart", "cuda_runtime.h"), ("cccl", "cuda/std/version")):
        d = _locate(lib, marker)
        if d is not None and d not in dirs:
            dirs.append(d)
    versions = tuple((p, v) for p in HEADER_PACKAGES if (v := _dist_version(p)) is not None)
    for pkg, v in versions:
        major = int(v.split(".")[0])
        if nvrtc_major is not None and pkg != "nvidia-cuda-cccl" and major != nvrtc_major:
            raise ConfigError(
                f"{pkg} {v} provides CUDA {major} headers but NVRTC is CUDA {nvrtc_major}; install "
                f"'{pkg}=={nvrtc_major}.*' (the khal hook pins it to NVRTC's major in isolated builds)"
            )
    return HeaderSet("wheels", tuple(dirs), versions)


def _system() -> HeaderSet:
    root = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not root:
        raise ConfigError(
            "option 'cuda-headers' = \"system\" needs CUDA_HOME or CUDA_PATH to point at a CUDA toolkit"
        )
    inc = Path(root) / "include"
    if not (inc / "cuda_runtime.h").is_file():
        raise ConfigError(
            f"option 'cuda-headers' = \"system\": {inc} has no cuda_runtime.h; "
            "check CUDA_HOME / CUDA_PATH"
        )
    dirs = [inc] + ([inc / "cccl"] if (inc / "cccl").is_dir() else [])
    stamp = Path(root) / "version.json"
    ident = stamp if stamp.is_file() else inc / "cuda.h"
    digest = hashlib.sha256(ident.read_bytes()).hexdigest() if ident.is_file() else "unknown"
    return HeaderSet("system", tuple(dirs), (("toolkit:" + ident.name, digest),))


def nvrtc_cuda_major() -> int | None:
    """The CUDA major of the NVRTC in use (the header wheels must match it), None without NVRTC."""
    try:
        return int(get_compiler("nvrtc").identity().version.split(".")[0])
    except KhalBuildError:
        return None  # prebuilt-only builds may have no NVRTC


def resolve_headers(mode: str, nvrtc_major: int | None) -> HeaderSet:
    if mode == "none":
        return HeaderSet("none")
    if mode == "system":
        return _system()
    return _wheels(nvrtc_major)


_PROVIDERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^crt/"), "nvidia-cuda-crt"),
    (re.compile(r"^(cub|thrust|nv|cuda)/"), "nvidia-cuda-cccl"),
    (re.compile(r"^(cuda_|cooperative_groups|vector_|device_|sm_\d+|builtin_types|host_defines|"
                r"channel_descriptor|driver_|surface_|texture_|math_|mma\.h|cuComplex)"), "nvidia-cuda-runtime"),
]
_STD = re.compile(r"^(c?std\w*|stdint\.h|stddef\.h|stdio\.h|stdlib\.h|math\.h|string\.h|assert\.h|limits|type_traits|"
                  r"utility|algorithm|array|vector|string|iostream|cmath|cassert|climits|cstring|cstdio)(\.h)?$")


def header_hint(header: str, mode: str) -> str:
    """What to do about a header NVRTC could not open."""
    for pattern, pkg in _PROVIDERS:
        if pattern.search(header):
            if mode == "wheels":
                return (f"<{header}> comes from the {pkg} wheel: the hatchling hook adds it to isolated "
                        f"builds (setuptools projects list it in [build-system] requires); for "
                        f"--no-build-isolation builds run: pip install {pkg}")
            if mode == "none":
                return (f"<{header}> comes from the {pkg} wheel, but option 'cuda-headers' is \"none\"; "
                        "set it to \"wheels\" (the default) or \"system\"")
            return f"<{header}> should be in the toolkit under CUDA_HOME/CUDA_PATH (option 'cuda-headers' = \"system\")"
    if _STD.match(header):
        return (f"<{header}> is a host C/C++ standard header, which NVRTC does not have; khal.h defines "
                "intN_t/uintN_t, libdevice provides the math functions, and <cuda/std/...> (nvidia-cuda-cccl) "
                "has device versions of much of the standard library")
    return f"\"{header}\" is not in the crate's folders: check the #include and the option 'include-dirs'"


_MISSING_HEADER = re.compile(r'(?:could not|cannot) open source file "([^"]+)"')


def header_hints(compiler_log: str, mode: str) -> str:
    """``hint: ...`` lines for every header NVRTC could not open in ``compiler_log`` ("" if none)."""
    names = sorted(set(_MISSING_HEADER.findall(compiler_log)))
    return "\n".join(f"hint: {header_hint(n, mode)}" for n in names)
