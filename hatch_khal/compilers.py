"""The compiler seam: what the build needs of a compiler, and the registry of compilers.

A :class:`Compiler` turns a :class:`~hatch_khal.model.CompileJob` into bytes, names itself
for cache keys and the manifest (:meth:`Compiler.identity`), lists the archs it can target,
and checks that an output (fresh or from the cache) is what the job asked for. NVRTC
(:class:`hatch_khal.nvrtc.NvrtcCompiler`) is the first; a Slang stage registers its own
under another name. Compile jobs carry the compiler's *name* so that worker processes
can look it up without pickling a compiler object.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from hatch_khal.errors import KhalBuildError
from hatch_khal.model import CompileJob, CompileOutput, CompilerIdentity

__all__ = ["COMPILERS", "Compiler", "binary_mismatch", "get_compiler"]


class Compiler(Protocol):
    name: str

    def identity(self) -> CompilerIdentity:
        """Name and version; raises KhalBuildError when the compiler is not available."""
        ...

    def supported_archs(self) -> tuple[int, ...]:
        """Numeric archs it can target (90 for sm_90 / compute_90)."""
        ...

    def compile(self, job: CompileJob) -> CompileOutput:
        """Compile one job; CompileError / ConfigError naming the crate on failure. The output's
        ``reads`` lists every file the compiler opened (checked against the content hash before
        caching, :mod:`hatch_khal.reads`); None when it cannot say, and then it is not cached."""
        ...

    def check_output(self, job: CompileJob, data: bytes) -> str | None:
        """Why ``data`` is not an output of ``job`` (wrong kind or arch, unreadable), or None."""
        ...


#: name -> "module:attribute" of a Compiler instance, imported on first use only (the
#: worker process and prebuilt-only builds never import a compiler they do not run).
COMPILERS: dict[str, str] = {
    "nvrtc": "hatch_khal.nvrtc:NVRTC",
    "triton-ptxas": "hatch_khal.triton.language:PTXAS",
}


def get_compiler(name: str) -> Compiler:
    try:
        target = COMPILERS[name]
    except KeyError:
        raise KhalBuildError(f"no compiler called {name!r} (known: {', '.join(sorted(COMPILERS))})") from None
    module, _, attr = target.partition(":")
    compiler: Compiler = getattr(importlib.import_module(module), attr)
    return compiler


def binary_mismatch(job: CompileJob, data: bytes) -> str | None:
    """Why ``data`` is not the PTX / cubin ``job`` asks for (unreadable, the other kind, another arch),
    or None: the :meth:`Compiler.check_output` of the compilers that make CUDA binaries."""
    # lazy: the binary readers only when an output is checked
    from khal_runtime.abi import parse_arch
    from khal_runtime.binaries import BinaryFormatError, read_binary

    want = parse_arch(job.target)
    kind = "cubin" if want.kind == "sm" else "ptx"
    try:
        info = read_binary(data, f"crate {job.crate} {job.target}")
    except BinaryFormatError as exc:
        return str(exc)
    if info.kind != kind:
        return f"it is a {info.kind}, not a {kind}"
    if info.arch != want.number:
        what = "cubin for sm_" if kind == "cubin" else "PTX for .target sm_"
        return f"it is a {what}{info.arch}, not for {job.target}"
    return None
