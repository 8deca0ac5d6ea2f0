"""The CUDA headers a crate compiles against: from PyPI wheels, a toolkit, or none.

By default (``cuda-headers = "wheels"``) the headers come from the wheels the
hook adds to the build environment, matched to NVRTC's CUDA major:
``nvidia-cuda-runtime`` (cuda_fp16.h, cuda_bf16.h, cooperative_groups.h, ...),
``nvidia-cuda-crt`` (``crt/``) and ``nvidia-cuda-cccl`` (CUB, Thrust, libcu++) for CUDA 13,
``nvidia-cuda-runtime-cu12`` and ``nvidia-cuda-cccl-cu12`` for CUDA 12
(:mod:`hatch_khal.nvidia_wheels`), found on sys.path or with cuda-pathfinder. ``"system"`` takes a toolkit's ``include`` folder
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
from hatch_khal.nvidia_wheels import FAMILIES, admitted_majors, family_for_major, header_spec

__all__ = ["HEADER_PACKAGES", "HeaderSet", "header_hint", "header_hints", "header_packages", "header_requirements",
           "nvrtc_cuda_major", "resolve_headers"]

#: The wheels that carry the CUDA headers (CUDA 13 naming: no -cuXX suffix).
HEADER_PACKAGES = FAMILIES[0].header_packages


def header_packages(nvrtc_major: int | None) -> tuple[str, ...]:
    """The header wheels of NVRTC's CUDA major (CUDA 13's names when it is not known)."""
    fam = family_for_major(nvrtc_major) if nvrtc_major is not None else None
    return (fam or FAMILIES[0]).header_packages


@dataclass(frozen=True)
class HeaderSet:
    mode: str
    include_dirs: tuple[Path, ...] = ()
    #: What identifies these headers in hashes and cache keys.
    fingerprint: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: NVRTC's CUDA major, when known: which wheels the hints name
    nvrtc_major: int | None = None


def header_requirements(nvrtc_requirement: str) -> list[str]:
    """Header wheels for the build environment, matched to NVRTC.

    The runtime (and, for CUDA 13, crt) wheels are released with NVRTC and take its version
    specifier at the minor level (``~=13.0.0``, ``>=12.8``, ``==13.5.37`` -> ``==13.5.*``: their
    patch numbers differ from NVRTC's). CUDA 13's CCCL has its own release numbers, so it is
    pinned to NVRTC's CUDA major only; CUDA 12's (``nvidia-cuda-cccl-cu12``) follows CUDA's.
    """
    # lazy: packaging only when the hook's dependencies() asks
    from hatch_khal.nvidia_wheels import parse_nvrtc_requirement

    try:
        req, fam = parse_nvrtc_requirement(nvrtc_requirement)
    except ValueError as exc:
        raise ConfigError(f"option 'nvrtc-requirement': {exc}") from None
    spec = header_spec(req.specifier)
    out = [f"{fam.runtime}{spec}"] + ([f"{fam.crt}{spec}"] if fam.crt else [])
    if fam.cccl_follows_cuda:
        return out + [f"{fam.cccl}{spec}"]
    majors = admitted_majors(req.specifier, fam.lo, fam.hi)
    if majors[-1] == fam.hi - 1:  # no upper bound
        cccl = f"{fam.cccl}>={majors[0]}"
    else:
        cccl = f"{fam.cccl}>={majors[0]},<{majors[-1] + 1}"
    return out + [cccl]


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # lazy: only crates with CUDA headers

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _subdirs(lib: str, nvrtc_major: int | None) -> list[str]:
    """Folders (under a site-packages) that hold ``lib``'s headers for NVRTC's major, best first."""
    if nvrtc_major is not None:
        fam = family_for_major(nvrtc_major)
        return list(fam.include_subdirs(lib, nvrtc_major)) if fam else []
    out: list[str] = []
    for fam in FAMILIES:  # unknown major: any family, newest first
        out += [d for m in range(fam.hi - 1, fam.lo - 1, -1) for d in fam.include_subdirs(lib, m) if d not in out]
    return out


def _locate(lib: str, marker: str, nvrtc_major: int | None) -> Path | None:
    """A header folder from the wheels in this environment, of NVRTC's CUDA major.

    sys.path first (an isolated build environment's packages are only there), then
    cuda-pathfinder, which searches the interpreter's site-packages (its answer is taken only
    when it is a folder of NVRTC's family).
    """
    subdirs = _subdirs(lib, nvrtc_major)
    for base in sys.path:
        if not base or not Path(base).is_dir():
            continue
        for sub in subdirs:
            if (Path(base, sub) / marker).is_file():
                return Path(base, sub)
    try:
        # lazy: cuda-pathfinder only when the headers are not on sys.path
        from cuda.pathfinder import locate_nvidia_header_directory
    except ImportError:  # older cuda-pathfinder
        return None
    try:
        located = locate_nvidia_header_directory(lib)
    except Exception:  # pathfinder raises for setups it does not know
        return None
    if located is None or located.found_via != "site-packages":
        return None
    found = Path(located.abs_path)
    if not any(found.as_posix().endswith("/" + sub) for sub in subdirs):
        return None  # another CUDA major's headers
    return found


@lru_cache(maxsize=None)
def _wheels(nvrtc_major: int | None) -> HeaderSet:
    dirs: list[Path] = []
    for lib, marker in (("cudart", "cuda_runtime.h"), ("cccl", "cuda/std/version")):
        d = _locate(lib, marker, nvrtc_major)
        if d is not None and d not in dirs:
            dirs.append(d)
    fam = family_for_major(nvrtc_major) if nvrtc_major is not None else None
    versions = tuple((p, v) for p in header_packages(nvrtc_major) if (v := _dist_version(p)) is not None)
    for pkg, v in versions:
        major = int(v.split(".")[0])
        if nvrtc_major is not None and (fam is None or pkg != fam.cccl or fam.cccl_follows_cuda) \
                and major != nvrtc_major:
            raise ConfigError(
                f"{pkg} {v} provides CUDA {major} headers but NVRTC is CUDA {nvrtc_major}; install "
                f"'{pkg}=={nvrtc_major}.*' (the khal hook pins it to NVRTC's major in isolated builds)"
            )
    return HeaderSet("wheels", tuple(dirs), versions, nvrtc_major)


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
_STD = re.compile(r"(c?std\w*|stdint\.h|stddef\.h|stdio\.h|stdlib\.h|math\.h|string\.h|assert\.h|limits|type_traits|"
                  r"utility|algorithm|array|vector|string|iostream|cmath|cassert|climits|cstring|cstdio|iterator|memory|"
                  r"tuple|functional|numeric|new|initializer_list)(\.h)?")  # fullmatch

#: headers of the full CUDA toolkit that no PyPI wheel ships (so no 'cuda-headers' = "wheels" build
#: has them), with what they provide and what to write instead under NVRTC
_TOOLKIT_ONLY = {
    "nvfunctional": ("nvstd::function", "take the callable as a template parameter (a functor, a lambda, or a "
                     "function object of <cuda/std/functional>; libcu++ has no cuda::std::function)"),
}


#: headers of the CUDA profiler API -> what they declare. In no header wheel the hook adds
#: (nvidia-cuda-runtime has cudaProfilerTypedefs.h only; the nvidia-cuda-profiler-api wheel has them), and
#: NVRTC cannot compile them where they are found: their functions are __host__ ones ("A function
#: explicitly marked as a __host__ function is not allowed in JIT mode", measured with 13.5.25's)
_PROFILER_API = {"cuda_profiler_api.h": "cudaProfilerStart / cudaProfilerStop",
                 "cudaProfiler.h": "cuProfilerStart / cuProfilerStop"}


def _profiler_hint(header: str, fam_runtime: str) -> str:
    return (f"<{header}> ({_PROFILER_API[header]}) is the CUDA profiler's host API: it is not in {fam_runtime} "
            "nor in any header wheel the hook adds, and where it is found (a toolkit, the nvidia-cuda-profiler-api "
            "wheel) NVRTC refuses its __host__ functions; kernel code cannot call them: drop the #include from "
            "the crate's sources and start / stop the profiler from the host (cuda.bindings.runtime."
            "cudaProfilerStart(), torch.cuda.profiler.start())")


def _missing_from_wheels(header: str, nvrtc_major: int | None) -> bool:
    """The header wheels' folders were found here and none holds ``header``: it is not theirs."""
    try:
        dirs = _wheels(nvrtc_major).include_dirs
    except KhalBuildError:
        return False
    return bool(dirs) and not any((d / header).is_file() for d in dirs)


def header_hint(header: str, mode: str, nvrtc_major: int | None = None) -> str:
    """What to do about a header NVRTC could not open (naming the wheels of NVRTC's CUDA major)."""
    fam = (family_for_major(nvrtc_major) if nvrtc_major is not None else None) or FAMILIES[0]
    if header in _PROFILER_API:
        return _profiler_hint(header, fam.runtime)
    if header in _TOOLKIT_ONLY:
        what, instead = _TOOLKIT_ONLY[header]
        base = (f"<{header}> ({what}) is a header of the full CUDA toolkit that no PyPI wheel ships (not "
                f"{fam.runtime}, not {fam.cccl})")
        if mode == "system":
            return (f"{base}, and the toolkit under CUDA_HOME / CUDA_PATH has none in its include folder: "
                    f"check that it is a full toolkit, or {instead}")
        return (f"{base}, so a build from the wheels cannot open it: {instead}; or, where a CUDA toolkit is "
                "installed, set option 'cuda-headers' = \"system\" (CUDA_HOME) to compile against its headers")
    for pattern, pkg in _PROVIDERS:
        if pattern.search(header):
            if pkg == "nvidia-cuda-crt" and fam.crt is None:
                return (f"<{header}> is internal to the CUDA headers, and CUDA {nvrtc_major} has no wheel of "
                        "crt/ headers; include the public header (cuda_runtime.h, cuda_fp16.h, ...) instead")
            pkg = {"nvidia-cuda-cccl": fam.cccl, "nvidia-cuda-runtime": fam.runtime}.get(pkg, pkg)
            if mode == "wheels" and _missing_from_wheels(header, nvrtc_major):
                return (f"<{header}> looks like a header of {pkg}, but the {pkg} wheel installed here does not "
                        "ship it (nor does any header wheel the hook adds): it is a header of the full CUDA "
                        "toolkit only; drop the #include, or, where a CUDA toolkit is installed, set option "
                        "'cuda-headers' = \"system\" (CUDA_HOME) to compile against its headers")
            if mode == "wheels":
                return (f"<{header}> comes from the {pkg} wheel: the hatchling hook adds it to isolated "
                        f"builds (setuptools projects list it in [build-system] requires); for "
                        f"--no-build-isolation builds run: pip install {pkg}")
            if mode == "none":
                return (f"<{header}> comes from the {pkg} wheel, but option 'cuda-headers' is \"none\"; "
                        "set it to \"wheels\" (the default) or \"system\"")
            return f"<{header}> should be in the toolkit under CUDA_HOME/CUDA_PATH (option 'cuda-headers' = \"system\")"
    if _STD.fullmatch(header):
        return (f"<{header}> is a host C/C++ standard header, which NVRTC does not have; khal.h defines "
                "intN_t/uintN_t, libdevice provides the math functions, and <cuda/std/...> (nvidia-cuda-cccl) "
                "has device versions of much of the standard library")
    return f"\"{header}\" is not in the crate's folders: check the #include and the option 'include-dirs'"


_MISSING_HEADER = re.compile(r'(?:could not|cannot) open source file "([^"]+)"')


def header_hints(compiler_log: str, mode: str, nvrtc_major: int | None = None) -> str:
    """``hint: ...`` lines for every header NVRTC could not open in ``compiler_log`` ("" if none),
    naming the header wheels of NVRTC's CUDA major."""
    names = sorted(set(_MISSING_HEADER.findall(compiler_log)))
    return "\n".join(f"hint: {header_hint(n, mode, nvrtc_major)}" for n in names)
