"""Build a synthetic shader package without the build hook (tests only).

Writes CUDA C++ with ``extern "C"`` kernels named ``<entry>_khal_<hash>`` that
follow the khal ABI directly, compiles it with ``cuda.bindings.nvrtc`` (works
without a GPU) to PTX and cubins, and writes the manifest through the pydantic
models. Used by the CPU tests and the GPU tests alike.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from khal_runtime import abi
from khal_runtime.binaries import scan_ptx
from khal_runtime.manifest_load import DIGEST_NAME, build_digest
from khal_runtime.manifest import (
    SCHEMA_VERSION,
    Artifact,
    Crate,
    Editable,
    Entry,
    Manifest,
    Param,
    SourceFile,
    Toolchain,
    symbol_for,
)

CRATE = "core"

#: Kernel bodies, with {sym} for the generated symbol. Each follows the khal ABI.
KERNELS: dict[str, str] = {
    "fill": r"""
extern "C" __global__ void {sym}(unsigned int* out, unsigned long long out_count, unsigned int value) {{
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < out_count) out[i] = value;
}}
""",
    "axpby": r"""
struct AxpbyParams {{ float a; float b; }};
extern "C" __global__ void {sym}(const float* x, unsigned long long x_count, float* y,
                                 unsigned long long y_count, const AxpbyParams* p, float bias) {{
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < y_count && i < x_count) y[i] = p->a * x[i] + p->b * y[i] + bias;
}}
""",
    "scalars": r"""
extern "C" __global__ void {sym}(unsigned long long* out, unsigned long long out_count,
                                 signed char a, unsigned short b, long long c, float d,
                                 unsigned short e, bool f, double g, unsigned short h) {{
    if (blockIdx.x == 0 && threadIdx.x == 0 && out_count >= 8) {{
        out[0] = (unsigned long long)(long long)a;
        out[1] = b;
        out[2] = (unsigned long long)c;
        out[3] = __float_as_uint(d);
        out[4] = e;
        out[5] = f ? 1ull : 0ull;
        out[6] = (unsigned long long)__double_as_longlong(g);
        out[7] = h;
    }}
}}
""",
}


def _storage(name: str, et: str, size: int, *, writable: bool, shape: str = "slice",
             length: int | None = None) -> Param:
    return Param(name=name, kind="storage", element_type=et, element_size=size, element_align=size,
                 shape=shape, length=length, writable=writable)


def _scalar(name: str, et: str, size: int) -> Param:
    return Param(name=name, kind="scalar", element_type=et, element_size=size, element_align=size)


PARAMS: dict[str, tuple[tuple[Param, ...], tuple[int, int, int]]] = {
    "fill": ((_storage("out", "uint32", 4, writable=True), _scalar("value", "uint32", 4)), (128, 1, 1)),
    "axpby": (
        (
            _storage("x", "float32", 4, writable=False),
            _storage("y", "float32", 4, writable=True),
            Param(name="p", kind="uniform", element_type="AxpbyParams", element_size=8, element_align=4),
            _scalar("bias", "float32", 4),
        ),
        (256, 1, 1),
    ),
    "scalars": (
        (
            _storage("out", "uint64", 8, writable=True, shape="array", length=8),
            _scalar("a", "int8", 1), _scalar("b", "float16", 2), _scalar("c", "int64", 8),
            _scalar("d", "float32", 4), _scalar("e", "uint16", 2), _scalar("f", "bool", 1),
            _scalar("g", "float64", 8), _scalar("h", "bfloat16", 2),
        ),
        (32, 1, 1),
    ),
}


def content_hash(build_id: str, names: Sequence[str] = tuple(KERNELS)) -> str:
    """The crate's content hash: its kernel templates (before symbols go in) and the build id."""
    return hashlib.sha256("\0".join([build_id, *(KERNELS[n] for n in names)]).encode()).hexdigest()


def entry_hash(name: str, build_id: str, names: Sequence[str] = tuple(KERNELS)) -> str:
    """As a build computes it: over the entry's signature and its crate's content hash."""
    params, block = PARAMS[name]
    return abi.entry_hash(content_hash(build_id, names), abi.entry_signature(name, block, params))


def cuda_source(build_id: str, names: Sequence[str] = tuple(KERNELS)) -> str:
    parts = [f"// synthetic khal crate, build {build_id}\n"]
    for n in names:
        parts.append(KERNELS[n].format(sym=symbol_for(n, entry_hash(n, build_id, names))))
    return "".join(parts)


def nvrtc_compile(source: str, arch: str, name: str = "core.cu") -> bytes:
    """PTX (arch compute_XY) or cubin (arch sm_XY) from NVRTC, no driver needed."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    assert not err, err
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = bytearray(size)  # never b" " * size: for size 1 that is CPython's shared b" "
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed for {arch}: {log.decode(errors='replace')}")
        if arch.startswith("sm_"):
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            out = bytearray(size)
            nvrtc.nvrtcGetCUBIN(prog, out)
        else:
            _, size = nvrtc.nvrtcGetPTXSize(prog)
            out = bytearray(size)
            nvrtc.nvrtcGetPTX(prog, out)
            out = out.rstrip(b"\0")
        return bytes(out)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


@dataclass
class SyntheticPackage:
    name: str
    root: Path  # directory on sys.path
    package_dir: Path
    manifest: Manifest
    build_id: str
    project_root: Path | None = None

    @property
    def manifest_path(self) -> Path:
        return self.package_dir / "_khal" / "manifest.json"

    def artifact_file(self, kind: str, arch: str | None = None) -> Path:
        a = self.manifest.crate(CRATE).artifact(kind, arch)
        assert a is not None
        return self.package_dir / a.path

    def write_manifest(self, manifest: Manifest) -> None:
        """Write ``manifest`` as the build does: its JSON, and the digest that lets the runtime read
        it without validating it again (:mod:`khal_runtime.manifest_load`)."""
        self.manifest = manifest
        data = manifest.to_json().encode()
        self.manifest_path.write_bytes(data)
        digest = build_digest(data)
        if digest is not None:
            (self.manifest_path.parent / DIGEST_NAME).write_text(digest + "\n")


def build_package(root: Path, name: str = "synth_khal_pkg", *, build_id: str = "v1",
                  cubin_archs: Sequence[str] = ("sm_90",), ptx_archs: Sequence[str] = ("compute_75",),
                  editable: bool = False, entries: Sequence[str] = tuple(KERNELS)) -> SyntheticPackage:
    """Write ``root/<name>/`` (importable with ``root`` on sys.path) and return its description."""
    root = Path(root)
    pkg = root / name
    if pkg.exists():
        shutil.rmtree(pkg)
    crate_dir = pkg / "_khal" / CRATE
    crate_dir.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n"
    )
    source = cuda_source(build_id, entries)
    project_root = None
    sources: tuple[SourceFile, ...] = ()
    if editable:
        project_root = root  # an editable install's package lives in its project
        (project_root / "kernels").mkdir(parents=True, exist_ok=True)
        (project_root / "kernels" / "core.cu").write_text(source)
        sources = (SourceFile(path="kernels/core.cu", sha256=hashlib.sha256(source.encode()).hexdigest()),)
    artifacts = []
    for arch in list(cubin_archs) + list(ptx_archs):
        data = nvrtc_compile(source, arch)
        kind = "cubin" if arch.startswith("sm_") else "ptx"
        fname = f"{CRATE}.{arch}.{kind}"
        (crate_dir / fname).write_bytes(data)
        isa = scan_ptx(data).ptx_isa if kind == "ptx" else None
        artifacts.append(Artifact(kind=kind, arch=arch, path=f"_khal/{CRATE}/{fname}",
                                  sha256=hashlib.sha256(data).hexdigest(), size=len(data), ptx_isa=isa))
    entry_models = []
    for n in entries:
        params, block = PARAMS[n]
        h = entry_hash(n, build_id, entries)
        entry_models.append(Entry(name=n, symbol=symbol_for(n, h), hash=h, block_size=block, params=params))
    major, minor = nvrtc_version()
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        package=name,
        toolchain=Toolchain(nvrtc_version=f"{major}.{minor}", hatch_khal_version="0.0.0+synthetic"),
        crates=(Crate(name=CRATE, package_dir=f"_khal/{CRATE}", sources=sources,
                      content_hash=content_hash(build_id, entries),
                      artifacts=tuple(artifacts), entries=tuple(entry_models)),),
        editable=Editable(project_root=str(project_root)) if project_root else None,
    )
    sp = SyntheticPackage(name, root, pkg, manifest, build_id, project_root)
    sp.write_manifest(manifest)
    return sp
