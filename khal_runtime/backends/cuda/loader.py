"""Choosing, verifying and loading a crate's binary on a CUDA device.

:func:`select_candidates` is pure (CPU-testable): exact cubin for the device's compute
capability, then a cubin of the same major with a lower minor, then PTX the driver can JIT
(by PTX ISA version). :func:`load_module` does the GPU half: check the chosen binary's entry
symbols carry the manifest hashes (and its arch is the manifest's), load it with
``cuLibraryLoadData``, resolve every kernel (a wrong-arch image only fails at lookup), and
check each kernel's parameter layout (``cuFuncGetParamInfo``) against the manifest's ABI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from khal_runtime import abi
from khal_runtime.backends.cuda.attributes import FunctionAttributes, prepare_function
from khal_runtime.backends.cuda.driver import check, driver
from khal_runtime.errors import ArtifactError, CudaError, NoCompatibleBinaryError, ParamLayoutError, PtxTooNewError
from khal_runtime.binaries import (  # noqa: F401 - re-exported: selection's names
    DRIVER_BRANCH,
    PTX_ISA_BY_DRIVER,
    max_ptx_isa,
    min_driver_for_ptx_isa,
    ptx_driver_note,
    ptx_isa_supported,
)
from khal_runtime.verify import check_launch_facts, check_symbols

if TYPE_CHECKING:
    from khal_runtime.manifest import Artifact, Crate, Entry

__all__ = [
    "DRIVER_BRANCH",
    "PTX_ISA_BY_DRIVER",
    "LoadedModule",
    "describe_shipped",
    "expected_param_layout",
    "load_module",
    "max_ptx_isa",
    "min_driver_for_ptx_isa",
    "ptx_driver_note",
    "ptx_isa_supported",
    "select_candidates",
]

# the PTX ISA <-> driver table lives with the binary reader (khal_runtime.binaries), which the
# build side (python -m hatch_khal inspect) shares; selection here uses it
def describe_shipped(crate: Crate) -> str:
    parts = []
    for a in crate.artifacts:
        if a.kind == "cubin":
            parts.append(f"cubin {a.arch}")
        elif a.kind == "ptx":
            parts.append(f"PTX {a.arch}" + (f" (PTX ISA {a.ptx_isa})" if a.ptx_isa else ""))
    return ", ".join(parts) or "no CUDA binaries"


def select_candidates(crate: Crate, cc: tuple[int, int], driver: tuple[int, int],
                      *, package: str = "", device: str = "") -> list[Artifact]:
    """Binaries that fit, best first. Raises NoCompatibleBinaryError / PtxTooNewError if none."""
    exact: list[Artifact] = []
    lower: list[tuple[int, Artifact]] = []
    ptx_ok: list[tuple[tuple[int, int], Artifact]] = []
    ptx_too_new: list[Artifact] = []
    for a in crate.artifacts:
        if a.arch is None or a.kind not in ("cubin", "ptx"):
            continue
        major, minor, suffix = abi.parse_arch(a.arch)[1:]
        if a.kind == "cubin":
            if (major, minor) == cc:
                exact.append(a)
            elif major == cc[0] and minor < cc[1] and suffix in ("", "f"):
                lower.append((minor, a))
        else:
            fits = (major, minor) == cc if suffix == "a" else (major, minor) <= cc
            if not fits:
                continue
            if ptx_isa_supported(a.ptx_isa, driver):
                ptx_ok.append(((major, minor), a))
            else:
                ptx_too_new.append(a)
    exact.sort(key=lambda a: a.arch != f"sm_{cc[0]}{cc[1]}")  # plain before "a"/"f" variants
    out = exact + [a for _, a in sorted(lower, key=lambda t: -t[0])]
    out += [a for _, a in sorted(ptx_ok, key=lambda t: t[0], reverse=True)]
    if out:
        return out
    where = f"crate {crate.name!r}" + (f" of package {package!r}" if package else "")
    dev = f"{device} " if device else ""
    arch = f"sm_{cc[0]}{cc[1]}"
    drv = f"CUDA {driver[0]}.{driver[1]}"
    if ptx_too_new:
        limit = max_ptx_isa(driver)
        isas = ", ".join(sorted({a.ptx_isa or "?" for a in ptx_too_new}))
        up_to = f"{limit[0]}.{limit[1]}" if limit else "?"
        raise PtxTooNewError(
            f"{where}: no cubin for the device {dev}({arch}), and its PTX (ISA {isas}) is newer "
            f"than the driver ({drv}, JITs PTX ISA up to {up_to}) "
            f"can compile; the package ships: {describe_shipped(crate)}. Update the NVIDIA driver, "
            f"or rebuild with a cubin for {arch} (or with an NVRTC no newer than the driver)"
        )
    raise NoCompatibleBinaryError(
        f"{where}: no binary for the device {dev}({arch}) with driver {drv}; the package ships: "
        f"{describe_shipped(crate)}. Rebuild it with {arch} in its arch list, or ship PTX"
    )


def expected_param_layout(entry: Entry) -> list[tuple[str, int, int]]:
    """(slot description, offset, size) of every kernel parameter the ABI pushes."""
    out: list[tuple[str, int, int]] = []
    off = 0
    for p in entry.params:
        for slot in p.slots:
            off = (off + slot.align - 1) // slot.align * slot.align
            desc = (f"{p.name} (scalar {p.element_type})" if slot.what == "value"
                    else f"{p.name} ({p.kind} {slot.what})")
            out.append((desc, off, slot.size))
            off += slot.size
    return out


@dataclass
class LoadedModule:
    device_id: int
    artifact: Artifact
    library: Any
    #: entry name -> CUfunction
    functions: dict[str, Any] = field(default_factory=dict)
    #: entry name -> CUfunction of its indirect (persistent-grid) variant
    indirect: dict[str, Any] = field(default_factory=dict)
    #: entry name -> its launch attributes, checked and set on its function(s) at load
    attributes: dict[str, FunctionAttributes] = field(default_factory=dict)
    #: entry name -> the same for its indirect variant's function
    indirect_attributes: dict[str, FunctionAttributes] = field(default_factory=dict)
    #: global name -> (device pointer, bytes), from cuLibraryGetGlobal at load
    globals: dict[str, tuple[int, int]] = field(default_factory=dict)


def load_module(crate: Crate, package: str, blobs: dict[str, bytes], device: Any,
                driver_version: tuple[int, int]) -> LoadedModule:
    """Load the best binary of ``crate`` that fits ``device`` (its context current)."""
    cc = device.compute_capability()
    label = f"{device.name} #{device.device_id}"
    candidates = select_candidates(crate, cc, driver_version, package=package, device=label)
    # the launch facts the checks of every launch use: backed by the shipped PTX, whichever binary loads
    facts = check_launch_facts(crate, blobs)
    if facts:
        raise facts[0].exception()
    failures: list[tuple[Artifact, CudaError]] = []
    for art in candidates:
        problems = check_symbols(crate, art, blobs[art.path])
        if problems:
            raise problems[0].exception()
        try:
            return _load_artifact(crate, device, art, blobs[art.path], package)
        except CudaError as exc:
            failures.append((art, exc))
    first = failures[0][1]
    arch = f"sm_{cc[0]}{cc[1]}"
    where = f"crate {crate.name!r} of package {package!r}"
    drv = f"CUDA {driver_version[0]}.{driver_version[1]}"
    tried = "; ".join(f"{a.path}: {e.code or e}" for a, e in failures)
    if any(e.code == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" for _, e in failures):
        raise PtxTooNewError(
            f"{where}: the driver ({drv}) rejected the PTX as too new for it "
            f"(CUDA_ERROR_UNSUPPORTED_PTX_VERSION) on {label} ({arch}); tried {tried}; "
            f"the package ships: {describe_shipped(crate)}. Update the NVIDIA driver or "
            f"rebuild with a cubin for {arch}"
        ) from first
    if all(e.code in ("CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_IMAGE",
                      "CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_INVALID_SOURCE") for _, e in failures):
        raise NoCompatibleBinaryError(
            f"{where}: the driver ({drv}) could not load any shipped binary on {label} ({arch}): "
            f"{tried}; the package ships: {describe_shipped(crate)}"
        ) from first
    raise first


def _load_artifact(crate: Crate, device: Any, art: Artifact, data: bytes, package: str = "") -> LoadedModule:
    drv = driver()
    image = data if art.kind == "cubin" or data.endswith(b"\0") else data + b"\0"
    lib = check(drv.cuLibraryLoadData(image, None, None, 0, None, None, 0), "cuLibraryLoadData")
    mod = LoadedModule(device.device_id, art, lib)
    where = f"crate {crate.name!r}" + (f" of package {package!r}" if package else "")
    try:
        for entry in crate.entries:
            mod.functions[entry.name] = _resolve(lib, entry.symbol)
            _check_layout(crate, entry, mod.functions[entry.name], art)
            # launch attributes: checked against the device and set on the function once, here
            if entry.attributes is not None:
                mod.attributes[entry.name] = prepare_function(entry, mod.functions[entry.name], device, where)
            if entry.indirect_symbol:
                mod.indirect[entry.name] = _resolve(lib, entry.indirect_symbol)
                if entry.attributes is not None:
                    mod.indirect_attributes[entry.name] = prepare_function(entry, mod.indirect[entry.name], device,
                                                                           where)
        for g in crate.globals or ():
            mod.globals[g.name] = _global(lib, g, where, art)
    except Exception:
        drv.cuLibraryUnload(lib)
        raise
    return mod


def _global(lib: Any, g: Any, where: str, art: Artifact) -> tuple[int, int]:
    """(device pointer, bytes) of module global ``g``: the binary must define it with the manifest's size."""
    res = driver().cuLibraryGetGlobal(lib, g.name.encode())
    if res[0]:
        raise ArtifactError(f"{where}: the manifest lists the global {g.name!r} ({g.space}, {g.size} bytes), which "
                            f"{art.path} does not define ({getattr(res[0], 'name', res[0])}); rebuild the package")
    ptr, size = int(res[1]), int(res[2])
    if size != g.size:
        raise ArtifactError(f"{where}: the global {g.name!r} is {size} bytes in {art.path}, the manifest says "
                            f"{g.size}; rebuild the package")
    return ptr, size


def _resolve(lib: Any, symbol: str) -> Any:
    drv = driver()
    kernel = check(drv.cuLibraryGetKernel(lib, symbol.encode()), f"cuLibraryGetKernel({symbol})")
    func = check(drv.cuKernelGetFunction(kernel), f"cuKernelGetFunction({symbol})")
    if hasattr(drv, "cuFuncLoad"):
        check(drv.cuFuncLoad(func), f"cuFuncLoad({symbol})")
    return func


def _check_layout(crate: Crate, entry: Entry, func: Any, art: Artifact) -> None:
    drv = driver()
    if not hasattr(drv, "cuFuncGetParamInfo"):
        return
    want = expected_param_layout(entry)
    where = f"entry {entry.name!r} (crate {crate.name!r}) in {art.path}"
    for i, (desc, off, size) in enumerate(want):
        res = drv.cuFuncGetParamInfo(func, i)
        if res[0]:
            raise ParamLayoutError(
                f"{where}: the binary has {i} kernel parameter(s), the manifest's ABI needs "
                f"{len(want)} (missing {desc}); rebuild the package"
            )
        got_off, got_size = int(res[1]), int(res[2])
        if (got_off, got_size) != (off, size):
            raise ParamLayoutError(
                f"{where}: kernel parameter {i} ({desc}) is {got_size} bytes at offset {got_off} "
                f"in the binary, the manifest says {size} bytes at offset {off}; rebuild the package"
            )
    extra = drv.cuFuncGetParamInfo(func, len(want))
    if not extra[0]:
        raise ParamLayoutError(
            f"{where}: the binary takes more than the {len(want)} kernel parameter(s) the "
            "manifest's ABI describes; rebuild the package"
        )


def unload(module: LoadedModule) -> None:
    driver().cuLibraryUnload(module.library)
