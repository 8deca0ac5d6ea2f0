"""NVRTC through ``cuda.bindings.nvrtc``: no CUDA toolkit, no GPU, no driver.

NVRTC itself comes from the ``nvidia-cuda-nvrtc`` wheel (CUDA 13 and later) or
``nvidia-cuda-nvrtc-cu12`` (CUDA 12), found on sys.path (and then by cuda-bindings, through
cuda-pathfinder). A process loads one NVRTC: where several are installed, the newest CUDA major
that the project's ``nvrtc-requirement`` admits (:func:`requirement`); one it does not admit is
a ConfigError. PTX is produced here rather than by ``cuda.core.Program``, whose PTX path asks
for a driver.

Every compile of the build runs in a process of its own (``python -m hatch_khal._worker --once``):
the binary from a plain compile, then the same unit again with ``--fdevice-syntax-only
--fdevice-time-trace``, whose trace lists every header NVRTC opened: the compile stage checks them
against the content hash before caching (:mod:`hatch_khal.reads`). The binary never comes from the
traced compile: the trace changes NVRTC's code generation for sm_100 and newer (other instructions,
another size; measured with 13.0.88 and 13.5.37), and with 13.0 differently from one run to the
next, so wheels would not be reproducible. A process of its own, because NVRTC 13.5 crashes in a
compile that follows a traced one in the same process.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence


from khal_runtime.abi import env_flag

from hatch_khal import _worker
from hatch_khal.compilers import binary_mismatch
from hatch_khal.errors import CompileError, ConfigError, KhalBuildError, from_name
from hatch_khal.model import CompileJob, CompileOutput, CompilerIdentity
from hatch_khal.nvidia_wheels import FAMILIES, admitted_majors, library_major

if TYPE_CHECKING:
    from hatch_khal.config import HookConfig, ResolvedCrate
    from hatch_khal.languages import BuildRequirement

__all__ = ["ANY_MINOR_ENV", "NVRTC", "OUTPUT_FORMAT", "REQUIREMENT_ENV", "CompileResult", "NvrtcCompiler",
           "nvrtc_requirements",
           "compile_listing_reads", "compile_unit", "nvrtc_release", "nvrtc_version", "ptx_problem", "requirement",
           "supported_archs"]

#: What an NVRTC output in the cache is, in the compile jobs' keys: 2, the binary of a plain compile
#: (1's came from the traced compile, whose sm_100+ cubins differ from build to build)
OUTPUT_FORMAT = 2

#: The project's ``nvrtc-requirement`` while a front-end builds (:func:`requirement`); in the
#: environment so that the compile worker processes, which inherit it, pick the same NVRTC.
REQUIREMENT_ENV = "KHAL_NVRTC_REQUIREMENT"


@contextmanager
def requirement(text: str) -> Iterator[None]:
    """Build under ``nvrtc-requirement`` ``text``: NVRTC is chosen by it and checked against it."""
    before = os.environ.get(REQUIREMENT_ENV)
    os.environ[REQUIREMENT_ENV] = text
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(REQUIREMENT_ENV, None)
        else:
            os.environ[REQUIREMENT_ENV] = before


def _required() -> tuple[str, tuple[int, ...]] | None:
    """(requirement, the CUDA majors its specifier admits) while a front-end builds, else None."""
    text = os.environ.get(REQUIREMENT_ENV, "").strip()
    majors = _majors(text) if text else None
    return (text, majors) if majors is not None else None


@lru_cache(maxsize=8)
def _majors(text: str) -> tuple[int, ...] | None:
    from packaging.requirements import InvalidRequirement, Requirement  # lazy: only while building

    try:
        spec = Requirement(text).specifier
    except InvalidRequirement:
        return None  # the hook validated its own; a malformed value set by hand selects nothing
    return tuple(admitted_majors(spec))


def _nvrtc() -> Any:
    try:
        # lazy: importing cuda.bindings is slow (benchmarks/RESULTS.md); prebuilt-only builds never need it
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - cuda-bindings is a dependency
        raise KhalBuildError(
            f"cuda-bindings is not importable ({exc}); install hatch-khal's dependencies"
        ) from None
    return nvrtc


def _check(result: object, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        err, msg = nvrtc.nvrtcGetErrorString(result)
        raise KhalBuildError(f"NVRTC {what} failed: {msg.decode() if isinstance(msg, bytes) else msg}")


def _find_wheel_nvrtc() -> Path | None:
    """libnvrtc from an NVRTC wheel anywhere on sys.path: of the newest CUDA major the
    requirement admits (:func:`requirement`), else the newest; the first on sys.path of a major.

    cuda-pathfinder looks in the interpreter's site-packages; an isolated build
    environment (pip, build, uv) installs the wheel in a directory that is only on
    sys.path, so look there too.
    """
    found: dict[int, Path] = {}
    for base in sys.path:
        if not base or not os.path.isdir(base):
            continue
        for pattern in (g for fam in FAMILIES for g in fam.library_globs):
            for p in sorted(Path(base).glob(pattern)):
                major = library_major(p.name)
                if major is not None and "builtins" not in p.name and "alt" not in p.name:
                    found.setdefault(major, p)
    if not found:
        return None
    req = _required()
    admitted = [m for m in found if req is None or m in req[1]]
    return found[max(admitted or found)]


@lru_cache(maxsize=1)
def _preload_nvrtc() -> Path | None:
    """Load the wheel's libnvrtc first, so cuda-bindings (via cuda-pathfinder) uses it; its path."""
    lib = _find_wheel_nvrtc()
    if lib is None:
        return None
    import ctypes  # lazy: only when a wheel's libnvrtc is to be preloaded

    # libnvrtc dlopens its builtins library by soname: load that first from the same folder.
    for dep in sorted(lib.parent.glob("libnvrtc-builtins.so.*")) + [lib]:
        try:
            ctypes.CDLL(str(dep), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        except OSError:
            pass  # leave the search to cuda-pathfinder, which reports what it tried
    return lib


@lru_cache(maxsize=1)
def _loaded_version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    _preload_nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # cuda-bindings raises when libnvrtc cannot be found
        req = _required()
        want = req[0] if req else "nvidia-cuda-nvrtc"
        raise KhalBuildError(
            f"NVRTC could not be loaded ({exc}). The khal hook needs the NVRTC wheel ({want!r}) "
            "in the build environment (the hatchling hook adds it to the build requirements itself; "
            "setuptools projects list it in [build-system] requires); for --no-build-isolation builds "
            f"run: pip install '{want}'"
        ) from None
    _check(err, "version query")
    return int(major), int(minor)


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use; a clear error when there is none, or when
    its CUDA major is not one the project's ``nvrtc-requirement`` admits."""
    version = _loaded_version()
    req = _required()
    if req is not None and version[0] not in req[1]:
        lib = _preload_nvrtc()
        raise ConfigError(
            f"option 'nvrtc-requirement' is {req[0]!r}, but the NVRTC found is {version[0]}.{version[1]}"
            f"{f' ({lib})' if lib else ''}: its PTX and cubins would be CUDA {version[0]}'s. The hatchling "
            f"hook installs the requirement in isolated builds; for --no-build-isolation (and setuptools) "
            f"builds run: pip install '{req[0]}' (one process loads one NVRTC: build in a fresh one)"
        )
    return version


def _loaded_library() -> Path | None:
    """The libnvrtc file this process loaded: the wheel's it preloaded, else the one the dynamic
    loader mapped (Linux: /proc/self/maps), else None."""
    lib = _preload_nvrtc()
    if lib is not None:
        return lib
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
        name = os.path.basename(path)
        if name.startswith("libnvrtc.so") and os.path.isfile(path):
            return Path(path)
    return None


def _wheel_version(lib: Path) -> str | None:
    """The version of the installed NVRTC distribution whose files include ``lib``, or None."""
    from importlib import metadata  # lazy: only when the compiler's identity is asked for

    real = os.path.realpath(lib)
    for fam in FAMILIES:
        for dist in metadata.distributions(name=fam.nvrtc):
            for f in dist.files or ():
                if f.name == lib.name and os.path.realpath(str(dist.locate_file(f))) == real:
                    return str(dist.version)
    return None


@lru_cache(maxsize=1)
def nvrtc_release() -> str:
    """The exact NVRTC in use, for cache keys and the manifest: the version of the wheel that
    ships the loaded library (``13.5.37``: two patch releases of one minor compile differently),
    else ``<major>.<minor>+lib.<sha256 of the library, 16 digits>``; ``<major>.<minor>`` only when the
    library file cannot be found at all."""
    major, minor = nvrtc_version()
    lib = _loaded_library()
    if lib is None:
        return f"{major}.{minor}"
    version = _wheel_version(lib)
    if version is not None and version.split(".")[:2] == [str(major), str(minor)]:
        return version
    import hashlib  # lazy: only for an NVRTC no wheel ships

    return f"{major}.{minor}+lib.{hashlib.sha256(lib.read_bytes()).hexdigest()[:16]}"


@lru_cache(maxsize=1)
def supported_archs() -> tuple[int, ...]:
    nvrtc = _nvrtc()
    _loaded_version()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "supported-architecture query")
    return tuple(int(a) for a in archs)


@dataclass(frozen=True)
class CompileResult:
    data: bytes
    log: str  # warnings (empty when clean)


def compile_unit(
    text: str,
    name: str,
    arch: str,
    options: list[str],
    crate: str,
    *,
    hidden: tuple[str, ...] = (),
) -> CompileResult:
    """Compile one translation unit for ``arch`` ('sm_90' → cubin, 'compute_75' → PTX).
    ``hidden``: options of the hook's own, left out of messages (the trace file)."""
    nvrtc = _nvrtc()
    nvrtc_version()
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], [])
    _check(err, "program creation")
    try:
        opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in (*options, *hidden)]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "log query")
        # NVRTC writes into the buffer: a fresh bytearray, never ``b" " * size``, which for
        # size 1 (an empty log) is CPython's shared b" " and would turn it into b"\x00" for
        # the whole process
        buf = bytearray(size)
        (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
        log = bytes(buf).rstrip(b"\x00").decode("utf-8", "replace").strip()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            if result == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION:
                raise ConfigError(
                    f"crate {crate!r}: NVRTC rejected the options {options + ['--gpu-architecture=' + arch]}: "
                    f"{log or 'invalid option'}; check 'options' of the khal hook"
                )
            raise CompileError(f"crate {crate!r} failed to compile for {arch}:\n{log}")
        if arch.startswith("compute_"):
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(err, "PTX size query")
            out = bytearray(size)
            (err,) = nvrtc.nvrtcGetPTX(prog, out)
            _check(err, "PTX retrieval")
            data = bytes(out).rstrip(b"\x00")
        else:
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check(err, "cubin size query")
            out = bytearray(size)
            (err,) = nvrtc.nvrtcGetCUBIN(prog, out)
            _check(err, "cubin retrieval")
            data = bytes(out)
        return CompileResult(data=data, log=log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


#: NVRTC's Chrome trace (``--fdevice-time-trace=<base>`` writes ``<base>.json``): one event of this
#: name per header it opened, ``args.detail`` its path as NVRTC opened it (measured with 13.5)
_HEADER_EVENT = "Processing Header File"


def _trace_reads(path: str) -> tuple[str, ...] | None:
    """The headers NVRTC opened, from its trace file; None when there is no readable trace."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        return None
    out: list[str] = []
    for e in events:
        if isinstance(e, dict) and e.get("name") == _HEADER_EVENT:
            detail = (e.get("args") or {}).get("detail")
            if isinstance(detail, str) and detail not in out:
                out.append(detail)
    return tuple(out)


#: the front end alone (no code generated): all a trace of the files read needs
_SYNTAX_ONLY = "--fdevice-syntax-only"


def _traced(text: str, name: str, arch: str, options: list[str], crate: str) -> tuple[str, ...] | None:
    """The files NVRTC reads compiling the unit: its front end run again with
    ``--fdevice-time-trace`` into a private folder (and ``--fdevice-syntax-only``, where this
    NVRTC has it: the front end is what opens headers). None when there is no readable trace.
    Raises ConfigError where NVRTC rejects the trace option (CUDA 12 releases before it had it)."""
    with tempfile.TemporaryDirectory(prefix="khal-trace-") as tmp:
        base = os.path.join(tmp, "trace")
        trace = f"--fdevice-time-trace={base}"
        try:
            compile_unit(text, name, arch, options, crate, hidden=(_SYNTAX_ONLY, trace))
        except ConfigError:  # an NVRTC without the syntax-only option: the whole compile, traced
            compile_unit(text, name, arch, options, crate, hidden=(trace,))
        return _trace_reads(base + ".json")


def compile_listing_reads(job: CompileJob) -> CompileOutput:
    """Compile ``job`` here: the output of a plain compile, and the files NVRTC read, from a traced
    run of its front end after it (:func:`_traced`; ``reads`` None where this NVRTC rejects
    ``--fdevice-time-trace``: CUDA 12 releases before it had it). A file changed between the two is
    caught by the compile stage's check of every file the content hash covers.

    Run it in a process of its own that compiles nothing else (:meth:`NvrtcCompiler.compile`
    does): after a traced compile, NVRTC 13.5 crashes in a later compile of the same process
    (measured: ``LLVM ERROR: out of memory``, ``std::length_error``, segfaults, with or without
    the trace on the later one); the traced one is the last."""
    t0 = time.perf_counter()
    r = compile_unit(job.text, job.name, job.target, list(job.options), job.crate)
    reads: tuple[str, ...] | None
    try:
        reads = _traced(job.text, job.name, job.target, list(job.options), job.crate)
    except ConfigError:  # NVRTC_ERROR_INVALID_OPTION: the trace option
        reads = None
    return CompileOutput(r.data, r.log, time.perf_counter() - t0, reads=reads)


def _in_child(job: CompileJob) -> CompileOutput:
    """:func:`compile_listing_reads` in a fresh ``python -m hatch_khal._worker --once``."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(_worker.command(once=True), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=log, env=_worker.environment())
        try:
            assert proc.stdin is not None and proc.stdout is not None
            payload = pickle.dumps(job)
            proc.stdin.write(_worker.HEADER.pack(len(payload)) + payload)
            proc.stdin.flush()
            head = proc.stdout.read(_worker.HEADER.size)
            body = proc.stdout.read(_worker.HEADER.unpack(head)[0]) if len(head) == _worker.HEADER.size else b""
            out = pickle.loads(body) if body else None
        except (OSError, pickle.UnpicklingError, EOFError):
            out = None
        finally:
            for pipe in (proc.stdin, proc.stdout):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if out is None:
            log.seek(0)
            tail = log.read().decode("utf-8", "replace")[-2000:]
            raise KhalBuildError(f"the NVRTC process compiling crate {job.crate!r} for {job.target} failed "
                                 f"(exit {proc.returncode}):\n{tail}")
    if out[0] != "ok":
        raise from_name(out[1], out[2])
    return CompileOutput(out[1], out[2], out[3], reads=out[4])


#: set (a boolean, ``1``): PTX from an NVRTC newer than ``nvrtc-requirement`` admits is built
#: anyway, as before 0.2.0 (a build without isolation used the installed NVRTC whatever its minor
#: version), instead of failing the build (:func:`ptx_problem`)
ANY_MINOR_ENV = "KHAL_NVRTC_ANY_MINOR"


def ptx_problem() -> str | None:
    """Why the PTX this build would write needs a newer driver than its ``nvrtc-requirement``
    promises, or None. A driver JITs PTX only up to its own CUDA version and NVRTC writes the PTX
    ISA of its own release, so PTX from NVRTC 13.5 needs a CUDA 13.5 driver, while the default
    requirement (CUDA 13.0's NVRTC) promises every CUDA 13 driver. An isolated build installs the
    requirement; a build without isolation (or a setuptools one) uses the NVRTC installed, and when
    that one is newer than the requirement admits (a release of a lower minor of its major is
    admitted, its own is not), the build fails saying so: pip shows a build's output only when it
    fails, so a warning would reach nobody. An older NVRTC than the requirement's is no driver
    problem (its PTX loads on more drivers) and passes, as before."""
    req = _required()
    if req is None or env_flag(os.environ.get(ANY_MINOR_ENV), ANY_MINOR_ENV):
        return None
    from packaging.requirements import Requirement  # lazy: only while building
    from packaging.version import InvalidVersion, Version  # lazy: only while building

    from khal_runtime.binaries import PTX_ISA_BY_DRIVER, ptx_driver_note  # lazy: only while building

    release = nvrtc_release()
    major, minor = nvrtc_version()
    try:
        have = Version(release.split("+", 1)[0])
    except InvalidVersion:
        return None
    spec = Requirement(req[0]).specifier
    if spec.contains(have, prereleases=True):
        return None
    lower = [f"{major}.{m}.{p}" for m in range(minor) for p in (0, 999)]
    if not any(spec.contains(v, prereleases=True) for v in lower):
        return None  # older than the requirement, or another major (nvrtc_version's check)
    isa = PTX_ISA_BY_DRIVER.get((major, minor), (major - 4, minor) if major >= 13 else None)
    need = ptx_driver_note(f"{isa[0]}.{isa[1]}" if isa else None) or f"needs a CUDA >= {major}.{minor} driver"
    lib = _loaded_library()
    return (f"the NVRTC in this build environment is {release}{f' ({lib})' if lib else ''}, newer than "
            f"option 'nvrtc-requirement' ({req[0]!r}) admits: the PTX it writes {need} to load, while the "
            f"requirement promises PTX for every driver it admits (a build with isolation installs the "
            f"requirement itself; this one uses the NVRTC installed here). Install the requirement "
            f"(pip install '{req[0]}'), or require this NVRTC (nvrtc-requirement = "
            f"\"nvidia-cuda-nvrtc>={major}.{minor}\" in the hook table: its PTX then needs that driver), or "
            f"build no PTX (ptx-arch = \"none\", or KHAL_PTX_ARCH=none); {ANY_MINOR_ENV}=1 builds it anyway")


class NvrtcCompiler:
    """NVRTC behind the :class:`hatch_khal.compilers.Compiler` seam (CUDA C++ -> PTX / cubin)."""

    name = "nvrtc"

    def ptx_problem(self) -> str | None:
        """:func:`ptx_problem`: asked by the planning stage of a crate that builds PTX."""
        return ptx_problem()

    def identity(self) -> CompilerIdentity:
        nvrtc_version()  # the requirement's check, on every call
        return CompilerIdentity(self.name, nvrtc_release())

    def supported_archs(self) -> tuple[int, ...]:
        return supported_archs()

    def compile(self, job: CompileJob) -> CompileOutput:
        """Compile in a process of its own, listing the files NVRTC read (:func:`compile_listing_reads`)."""
        return _in_child(job)

    def compile_here(self, job: CompileJob) -> CompileOutput:
        """:func:`compile_listing_reads` in this process (the ``--once`` worker calls this)."""
        return compile_listing_reads(job)

    def check_output(self, job: CompileJob, data: bytes) -> str | None:
        return binary_mismatch(job, data)


NVRTC = NvrtcCompiler()


def nvrtc_requirements(crates: Sequence[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
    """What compiling ``crates`` with NVRTC needs in the build environment (the languages whose
    crates NVRTC compiles ask for it): NVRTC, and the CUDA header wheels where a crate takes its
    headers from them. Nothing when every crate's binary is prebuilt."""
    # lazy: this module is imported by the compile workers; the requirement model only for builds
    from hatch_khal.frontend import all_prebuilt
    from hatch_khal.headers import header_requirements
    from hatch_khal.languages import BuildRequirement

    if not crates or all_prebuilt(list(crates)):
        return []
    spec = hook.nvrtc_requirement

    def probe() -> str | None:
        try:
            nvrtc_version()
        except KhalBuildError as exc:
            return str(exc)
        return None

    out = [BuildRequirement(spec, probe, label="the compiler")]
    if any(c.cuda_headers == "wheels" for c in crates):
        out += [BuildRequirement(r, checked_by_setuptools=False) for r in header_requirements(spec)]
    return out
