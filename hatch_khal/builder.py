"""Building crates: the core shared by the hatchling hook and the setuptools command.

``build_packages`` turns resolved crate configs into, per target package, a
manifest and the artifact bytes. It does no packaging itself: the hatch plugin
stages the files for the wheel, editable builds write them in place.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Protocol

from khal_runtime.binaries import BinaryFormatError, BinaryInfo, khal_symbols, read_binary
from khal_runtime.manifest import (
    MANIFEST_DIR,
    SCHEMA_VERSION,
    Artifact,
    Crate,
    Editable,
    Entry,
    Manifest,
    Param,
    Prebuilt,
    SourceFile as ManifestSource,
    SpirvStatus,
    Toolchain,
    symbol_for,
)

from hatch_khal.__about__ import __version__
from hatch_khal.cache import Cache, default_cache_dir
from hatch_khal.codegen import generate_unit, indirect_symbol_for, probe_names
from hatch_khal.config import ResolvedCrate, env_var_for_crate
from hatch_khal.entries import SCALAR_TYPES, EntryDecl, find_entries
from hatch_khal.errors import ConfigError, KhalBuildError, PrebuiltError, SourceError
from hatch_khal.headers import HeaderSet, header_hint, resolve_headers
from hatch_khal.hashing import canonical, crate_content_hash, entry_hash, khal_header_sha256, sha256_bytes
from hatch_khal.nvrtc import compile_unit, nvrtc_version, supported_archs
from hatch_khal.sources import CrateSources, collect_sources

__all__ = ["BuildResult", "PackageOutput", "Reporter", "build_packages", "khal_include_dir", "write_package_output"]

_BASE_OPTIONS = ["-std=c++17"]


class Reporter(Protocol):
    def info(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def debug(self, message: str) -> None: ...


class PrintReporter:
    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose

    def info(self, message: str) -> None:
        print(message)

    def warn(self, message: str) -> None:
        print(f"warning: {message}")

    def debug(self, message: str) -> None:
        if self.verbose:
            print(message)


def khal_include_dir() -> Path:
    """The directory holding khal.h, put on every crate's include path."""
    return Path(str(resources.files("hatch_khal") / "include"))


@dataclass
class PackageOutput:
    package: str  # package directory relative to the project root
    manifest: Manifest
    #: package-relative POSIX path -> bytes (the manifest included)
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class BuildResult:
    packages: list[PackageOutput]
    compiled: int = 0
    cached: int = 0
    seconds: float = 0.0


@dataclass
class _Job:
    crate: str
    arch: str
    text: str
    name: str
    options: list[str]
    key: str
    header_mode: str = "wheels"
    #: includes CUDA / CCCL headers: seconds per arch, compiled in worker processes
    heavy: bool = False


@dataclass
class _CratePlan:
    cfg: ResolvedCrate
    sources: CrateSources
    content_hash: str
    entries: list[tuple[EntryDecl, str]]
    spirv: SpirvStatus
    headers: HeaderSet
    prebuilt_var: str | None = None
    prebuilt_path: Path | None = None
    jobs: list[_Job] = field(default_factory=list)


def _nvrtc_major_or_none() -> int | None:
    try:
        return nvrtc_version()[0]
    except KhalBuildError:
        return None  # prebuilt-only builds may have no NVRTC


_MISSING_HEADER = re.compile(r'(?:could not|cannot) open source file "([^"]+)"')


def _with_header_hints(exc: KhalBuildError, mode: str) -> KhalBuildError:
    names = sorted(set(_MISSING_HEADER.findall(str(exc))))
    if not names:
        return exc
    hints = "\n".join(f"hint: {header_hint(n, mode)}" for n in names)
    return type(exc)(f"{exc}\n{hints}")


def _spirv_status(cfg: ResolvedCrate) -> SpirvStatus:
    if os.environ.get("KHAL_SKIP_SPIRV") is not None:
        return SpirvStatus(status="skipped", reason="KHAL_SKIP_SPIRV is set")
    if cfg.spirv:
        raise ConfigError(
            f"crate {cfg.name!r}: option 'spirv = true' asks for the SPIR-V stage, which this version "
            "of hatch-khal does not provide yet; set KHAL_SKIP_SPIRV=1 for a CUDA-only build or drop the option"
        )
    return SpirvStatus(status="not_configured", reason="'spirv' is not enabled for this crate")


def _check_archs(cfg: ResolvedCrate, reporter: Reporter) -> tuple[list[str], str | None]:
    supported = supported_archs()
    archs: list[str] = []
    for a in cfg.archs:
        num = int("".join(ch for ch in a.split("_", 1)[1] if ch.isdigit()))
        if num in supported:
            archs.append(a)
        elif cfg.archs_explicit:
            raise ConfigError(
                f"crate {cfg.name!r}: arch {a!r} (option 'archs' / KHAL_CUDA_ARCHS) is not supported by "
                f"NVRTC {'.'.join(map(str, nvrtc_version()))}; it supports "
                + ", ".join(f"sm_{s}" for s in supported)
            )
        else:
            reporter.warn(f"crate {cfg.name!r}: default arch {a} is not supported by this NVRTC; skipping it")
    ptx = cfg.ptx_arch
    if ptx is not None:
        num = int("".join(ch for ch in ptx.split("_", 1)[1] if ch.isdigit()))
        if num not in supported:
            raise ConfigError(
                f"crate {cfg.name!r}: PTX arch {ptx!r} (option 'ptx-arch' / KHAL_PTX_ARCH) is not supported "
                "by this NVRTC; it supports " + ", ".join(f"compute_{s}" for s in supported)
            )
    if not archs and ptx is None:
        raise ConfigError(f"crate {cfg.name!r}: no cubin arch and no PTX arch left to build")
    return archs, ptx


def _plan_crate(root: Path, cfg: ResolvedCrate) -> _CratePlan:
    include_dirs = []
    for d in cfg.include_dirs:
        p = (root / d).resolve()
        if not p.is_dir():
            raise ConfigError(f"crate {cfg.name!r}: include dir {d!r} (option 'include-dirs') is not a directory")
        include_dirs.append(p)
    sources = collect_sources(root, cfg.name, cfg.sources, include_dirs)
    decls: list[EntryDecl] = []
    for f in sources.all_files:
        decls.extend(find_entries(f.text, f.rel))
    if not decls:
        raise SourceError(
            f"crate {cfg.name!r}: no KHAL_ENTRY found in {', '.join(s.rel for s in sources.sources)}; "
            "mark kernels with KHAL_ENTRY(name, block_size, (params...)) from khal.h"
        )
    by_name: dict[str, EntryDecl] = {}
    for d in decls:
        if d.name in by_name:
            first = by_name[d.name]
            raise SourceError(
                f"{d.file}:{d.line}: crate {cfg.name!r}: entry {d.name!r} is defined twice "
                f"(first at {first.file}:{first.line})"
            )
        by_name[d.name] = d
    headers = HeaderSet(cfg.cuda_headers)
    extra: dict[str, object] = {}
    if sources.system_includes:
        # CUDA/CCCL headers are not hashed file by file: their package versions are.
        headers = resolve_headers(cfg.cuda_headers, _nvrtc_major_or_none())
        extra = {"cuda_headers": [cfg.cuda_headers, [list(f) for f in headers.fingerprint]]}
    content = crate_content_hash(sources.all_files, cfg.defines, cfg.options, extra)
    entries = [(d, entry_hash(content, d)) for d in sorted(decls, key=lambda e: e.name)]
    return _CratePlan(
        cfg=cfg, sources=sources, content_hash=content, entries=entries, spirv=_spirv_status(cfg), headers=headers
    )


def _params(crate: str, decl: EntryDecl, probes: dict[str, int]) -> tuple[Param, ...]:
    out = []
    for i, p in enumerate(decl.params):
        size_name, align_name = probe_names(decl.name, i)
        if size_name not in probes:
            raise KhalBuildError(
                f"crate {crate!r}: entry {decl.name!r}: the binary lacks the size probe {size_name}; "
                "was it built by hatch-khal from these sources?"
            )
        size, align = probes[size_name], probes.get(align_name, 1)
        elem_type = SCALAR_TYPES[p.ctype][0] if p.ctype in SCALAR_TYPES else p.ctype
        if p.ctype in SCALAR_TYPES and SCALAR_TYPES[p.ctype][1] != size:
            raise KhalBuildError(
                f"crate {crate!r}: entry {decl.name!r} parameter {p.name!r}: {p.ctype} is {size} bytes "
                f"on the device, expected {SCALAR_TYPES[p.ctype][1]}"
            )
        out.append(
            Param(
                name=p.name,
                kind=p.kind,  # type: ignore[arg-type]
                element_type=elem_type,
                element_size=size,
                element_align=align,
                shape=p.shape,  # type: ignore[arg-type]
                length=p.length,
                writable=p.kind == "storage" and not p.const,
            )
        )
    return tuple(out)


def _check_binary(plan: _CratePlan, info: BinaryInfo, what: str, error: type[KhalBuildError]) -> None:
    """Every entry symbol (direct and indirect) carries the hash the current sources give."""
    found = khal_symbols(info)
    var = plan.prebuilt_var
    hint = (
        f" ({var}={plan.prebuilt_path}); rebuild that file from the current sources or unset {var}"
        if var
        else ""
    )
    for decl, h in plan.entries:
        got = found.get(decl.name)
        if got is None:
            raise error(
                f"crate {plan.cfg.name!r}: {what} has no kernel for entry {decl.name!r} "
                f"(expected symbol {symbol_for(decl.name, h)}){hint}"
            )
        if got != h:
            raise error(
                f"crate {plan.cfg.name!r}: entry {decl.name!r}: {what} carries hash {got}, the current "
                f"sources give {h}{hint}"
            )
    expected = {d.name for d, _ in plan.entries} | {f"{d.name}_indirect" for d, _ in plan.entries}
    extra = sorted(set(found) - expected)
    if extra:
        raise error(
            f"crate {plan.cfg.name!r}: {what} has kernels for entries this crate does not define "
            f"({', '.join(extra)}): is it the binary of another crate?{hint}"
        )


def _read_prebuilt(plan: _CratePlan, root: Path) -> tuple[bytes, BinaryInfo]:
    var = plan.prebuilt_var
    assert var is not None
    raw = os.environ[var]
    path = Path(raw)
    if not path.is_absolute():
        path = root / path
    plan.prebuilt_path = path
    if not path.exists():
        raise PrebuiltError(f"{var}={raw}: no such file (crate {plan.cfg.name!r})")
    if path.is_dir():
        raise PrebuiltError(f"{var}={raw}: is a directory; point it at a .ptx or .cubin file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PrebuiltError(f"{var}={raw}: cannot read ({exc.strerror})") from None
    if not data:
        raise PrebuiltError(f"{var}={raw}: file is empty; expected PTX text or a cubin")
    try:
        info = read_binary(data, f"{var}={raw}")
    except BinaryFormatError as exc:
        raise PrebuiltError(str(exc)) from None
    _check_binary(plan, info, f"prebuilt {info.kind} {path.name}", PrebuiltError)
    if info.kind == "cubin" and f"sm_{info.arch}" not in plan.cfg.archs:
        raise PrebuiltError(
            f"{var}={raw}: the cubin is for sm_{info.arch}, but crate {plan.cfg.name!r} targets "
            f"{', '.join(plan.cfg.archs)}; build it for one of those, add sm_{info.arch} to 'archs', "
            "or give PTX instead"
        )
    return data, info


def _artifact(crate: str, kind: str, arch: str, data: bytes, isa: str | None) -> tuple[Artifact, str]:
    ext = "ptx" if kind == "ptx" else "cubin"
    path = f"{MANIFEST_DIR}/{crate}/{crate}.{arch}.{ext}"
    return (
        Artifact(kind=kind, arch=arch, path=path, sha256=sha256_bytes(data), size=len(data), ptx_isa=isa),  # type: ignore[arg-type]
        path,
    )


def _jobs(plan: _CratePlan, root: Path, archs: list[str], ptx: str | None) -> list[_Job]:
    cfg = plan.cfg
    unit = generate_unit(cfg.name, [s.path for s in plan.sources.sources], plan.entries)
    include = [f"-I{khal_include_dir()}"] + [f"-I{(root / d).resolve()}" for d in cfg.include_dirs]
    include += [f"-I{d}" for d in plan.headers.include_dirs]
    defines = [f"-D{k}={v}" if v != "" else f"-D{k}" for k, v in sorted(cfg.defines.items())]
    options = _BASE_OPTIONS + include + defines + list(cfg.options)
    major, minor = nvrtc_version()
    jobs = []
    for arch in ([ptx] if ptx else []) + archs:
        key = sha256_bytes(
            canonical(
                {
                    "content": plan.content_hash,
                    "generated": unit.generated,
                    "order": [s.rel for s in plan.sources.sources],
                    "options": _BASE_OPTIONS + defines + list(cfg.options),
                    "headers": [cfg.cuda_headers, [list(f) for f in plan.headers.fingerprint]],
                    "arch": arch,
                    "nvrtc": [major, minor],
                    "hatch_khal": __version__,
                    "khal_h": khal_header_sha256(),
                }
            )
        )
        jobs.append(_Job(cfg.name, arch, unit.text, f"{cfg.name}.khal.cu", options, key, cfg.cuda_headers,
                         heavy=bool(plan.sources.system_includes)))
    return jobs


def _compile_job(job: _Job) -> tuple[bytes, str, float]:
    t0 = time.perf_counter()
    r = compile_unit(job.text, job.name, job.arch, job.options, job.crate)
    return r.data, r.log, time.perf_counter() - t0


def _in_processes(todo: list[_Job], workers: int) -> list[object]:
    """Compile ``todo`` in ``workers`` child processes (``python -m hatch_khal._worker``)."""
    import pickle
    import subprocess
    import sys

    from hatch_khal import errors

    chunks = [todo[i::workers] for i in range(workers)]
    env = dict(os.environ)
    # the child sees what this process sees (an isolated build env is only on sys.path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    procs = []
    for chunk in chunks:
        proc = subprocess.Popen([sys.executable, "-m", "hatch_khal._worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps([(j.text, j.name, j.arch, j.options, j.crate) for j in chunk]))
        proc.stdin.close()
        procs.append(proc)
    results: dict[int, object] = {}
    for chunk, proc in zip(chunks, procs):
        assert proc.stdout is not None and proc.stderr is not None
        raw = proc.stdout.read()
        err = proc.stderr.read()
        proc.wait()
        try:
            outs = pickle.loads(raw) if proc.returncode == 0 else None
        except Exception:  # noqa: BLE001 - a broken worker is reported below
            outs = None
        if outs is None or len(outs) != len(chunk):
            tail = err.decode("utf-8", "replace")[-2000:]
            raise KhalBuildError(f"a compile worker process failed (exit {proc.returncode}):\n{tail}")
        for job, out in zip(chunk, outs):
            if out[0] == "ok":
                results[id(job)] = out[1:]
            else:
                cls = getattr(errors, out[1], KhalBuildError)
                results[id(job)] = cls(out[2]) if isinstance(cls, type) and issubclass(cls, KhalBuildError) \
                    else KhalBuildError(out[2])
    return [results[id(j)] for j in todo]


def _compile_all(
    todo: list[_Job], jobs: int | None, reporter: Reporter
) -> list[tuple[_Job, bytes, str, float]]:
    """Compile ``todo``: one job in this process; light crates in threads; header-heavy
    crates in worker processes.

    NVRTC releases the GIL but serialises much of its front end internally: threads overlap
    well for small translation units, while crates that include the CUDA headers or CCCL
    (seconds of parsing per arch) only scale in separate processes.
    """
    if not todo:
        return []
    workers = jobs or int(os.environ.get("KHAL_JOBS", "0") or 0) or os.cpu_count() or 1
    workers = max(1, min(workers, len(todo)))

    def attempt(job: _Job) -> object:
        try:
            return _compile_job(job)
        except KhalBuildError as exc:
            return exc

    if workers == 1:
        results = [attempt(j) for j in todo]
    elif any(j.heavy for j in todo):
        results = _in_processes(todo, workers)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(attempt, todo))
    outcomes = list(zip(todo, results))
    # All archs of a crate fail alike: report each crate's first failure once.
    failures: dict[str, KhalBuildError] = {}
    done = []
    for job, out in outcomes:
        if isinstance(out, KhalBuildError):
            failures.setdefault(job.crate, _with_header_hints(out, job.header_mode))
        else:
            data, log, secs = out  # type: ignore[misc]
            done.append((job, data, log, secs))
    if failures:
        first = next(iter(failures.values()))
        if len(failures) == 1:
            raise first
        raise type(first)("\n\n".join(str(e) for e in failures.values()))
    return done


def build_packages(
    root: Path,
    crates: list[ResolvedCrate],
    reporter: Reporter,
    *,
    editable: bool = False,
    cache: Cache | None = None,
    jobs: int | None = None,
) -> BuildResult:
    """Compile (or take prebuilt) every crate; group the results by target package."""
    start = time.perf_counter()
    root = root.resolve()
    plans = [_plan_crate(root, c) for c in crates]

    # Entry names are the runtime's attribute names: unique across one package.
    seen: dict[tuple[str, str], str] = {}
    for plan in plans:
        for decl, _ in plan.entries:
            k = (plan.cfg.package, decl.name)
            if k in seen:
                raise SourceError(
                    f"entry {decl.name!r} is defined in crate {seen[k]!r} and in crate {plan.cfg.name!r} "
                    f"of package {plan.cfg.package!r}; entry names must be unique per package"
                )
            seen[k] = plan.cfg.name

    for plan in plans:
        var = env_var_for_crate(plan.cfg.name)
        if os.environ.get(var):
            plan.prebuilt_var = var

    to_compile = [p for p in plans if p.prebuilt_var is None]
    if to_compile:
        for plan in to_compile:
            archs, ptx = _check_archs(plan.cfg, reporter)
            plan.jobs = _jobs(plan, root, archs, ptx)
    cache = cache if cache is not None else Cache(default_cache_dir(), reporter.warn)
    all_jobs = [j for p in to_compile for j in p.jobs]
    results: dict[tuple[str, str], tuple[bytes, bool]] = {}
    misses: list[_Job] = []
    for job in all_jobs:
        hit = cache.lookup(job.key)
        if hit is None:
            misses.append(job)
        else:
            results[(job.crate, job.arch)] = (hit.data, True)
            reporter.debug(f"khal: {job.crate} {job.arch}: cached")
    cached = len(all_jobs) - len(misses)
    if misses:
        with cache.locked(j.key for j in misses):
            todo = []
            for job in misses:  # another build may have stored them while we waited
                hit = cache.lookup(job.key)
                if hit is None:
                    todo.append(job)
                else:
                    results[(job.crate, job.arch)] = (hit.data, True)
                    cached += 1
            for job, data, log, secs in _compile_all(todo, jobs, reporter):
                cache.store(job.key, data, log)
                results[(job.crate, job.arch)] = (data, False)
                if log:
                    reporter.warn(f"crate {job.crate!r} ({job.arch}): NVRTC says:\n{log}")
                reporter.info(f"khal: compiled crate {job.crate!r} for {job.arch} in {secs:.2f}s")
    compiled = len(all_jobs) - cached

    toolchain = Toolchain(
        nvrtc_version=".".join(map(str, nvrtc_version())) if to_compile else None,
        hatch_khal_version=__version__,
    )
    outputs: dict[str, PackageOutput] = {}
    for plan in plans:
        crate, files = _finish_crate(plan, root, results)
        out = outputs.setdefault(plan.cfg.package, PackageOutput(plan.cfg.package, None, {}))  # type: ignore[arg-type]
        out.files.update(files)
        out.manifest = _merge(out.manifest, crate, toolchain, plan.cfg.package, root if editable else None)
    for out in outputs.values():
        out.files[f"{MANIFEST_DIR}/manifest.json"] = out.manifest.to_json().encode()
    return BuildResult(
        packages=[outputs[k] for k in sorted(outputs)],
        compiled=compiled,
        cached=cached,
        seconds=time.perf_counter() - start,
    )


def _merge(prev: Manifest | None, crate: Crate, toolchain: Toolchain, package: str, editable_root: Path | None) -> Manifest:
    crates = (prev.crates if prev else ()) + (crate,)
    return Manifest(
        schema_version=SCHEMA_VERSION,
        package=package.split("/")[-1],
        toolchain=toolchain,
        crates=tuple(sorted(crates, key=lambda c: c.name)),
        editable=Editable(project_root=str(editable_root)) if editable_root else None,
    )


def _finish_crate(
    plan: _CratePlan, root: Path, results: dict[tuple[str, str], tuple[bytes, bool]]
) -> tuple[Crate, dict[str, bytes]]:
    cfg = plan.cfg
    files: dict[str, bytes] = {}
    artifacts: list[Artifact] = []
    prebuilt: Prebuilt | None = None
    probe_info: BinaryInfo | None = None
    if plan.prebuilt_var:
        data, info = _read_prebuilt(plan, root)
        arch = f"sm_{info.arch}" if info.kind == "cubin" else f"compute_{info.arch}"
        art, path = _artifact(cfg.name, info.kind, arch, data, info.ptx_isa)
        artifacts.append(art)
        files[path] = data
        prebuilt = Prebuilt(variable=plan.prebuilt_var, kind=info.kind, file_name=plan.prebuilt_path.name)  # type: ignore[arg-type, union-attr]
        probe_info = info
    else:
        isa = None
        infos: list[tuple[_Job, bytes, BinaryInfo]] = []
        for job in plan.jobs:
            data, _hit = results[(cfg.name, job.arch)]
            try:
                info = read_binary(data, f"crate {cfg.name} {job.arch}")
            except BinaryFormatError as exc:
                raise KhalBuildError(f"NVRTC produced an unreadable binary: {exc}") from None
            _check_binary(plan, info, f"compiled {job.arch}", KhalBuildError)
            if info.kind == "ptx":
                isa = info.ptx_isa
            infos.append((job, data, info))
        for job, data, info in infos:
            kind = "ptx" if job.arch.startswith("compute_") else "cubin"
            art, path = _artifact(cfg.name, kind, job.arch, data, info.ptx_isa or isa)
            artifacts.append(art)
            files[path] = data
            if probe_info is None or info.kind == "ptx":
                probe_info = info
    assert probe_info is not None
    probes = dict(probe_info.globals_u64)
    entries = tuple(
        Entry(
            name=decl.name,
            symbol=symbol_for(decl.name, h),
            hash=h,
            block_size=(decl.block_size, 1, 1),
            params=_params(cfg.name, decl, probes),
            indirect_symbol=indirect_symbol_for(decl.name, h),
        )
        for decl, h in plan.entries
    )
    crate = Crate(
        name=cfg.name,
        package_dir=f"{MANIFEST_DIR}/{cfg.name}",
        sources=tuple(ManifestSource(path=f.rel, sha256=sha256_bytes(f.data)) for f in plan.sources.all_files),
        content_hash=plan.content_hash,
        artifacts=tuple(sorted(artifacts, key=lambda a: (a.kind, a.sm or 0, a.arch or ""))),
        entries=entries,
        prebuilt=prebuilt,
        spirv=plan.spirv,
    )
    return crate, files


def write_package_output(out: PackageOutput, package_dir: Path) -> list[Path]:
    """Write manifest + artifacts under ``package_dir`` (replacing its ``_khal``)."""
    import shutil
    import tempfile

    target = package_dir / MANIFEST_DIR
    package_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".khal-", dir=package_dir))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the package's files are not
    written = []
    try:
        for rel, data in sorted(out.files.items()):
            assert rel.startswith(MANIFEST_DIR + "/")
            dest = tmp / rel[len(MANIFEST_DIR) + 1 :]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            written.append(target / rel[len(MANIFEST_DIR) + 1 :])
        if target.exists():
            old = package_dir / f".khal-old-{os.getpid()}"
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written
