"""Triton crates in the build: the :class:`~hatch_khal.languages.Language` for ``language = "triton"``.

* :meth:`TritonLanguage.plan`: the crate's ``.py`` sources (and every file under their folders)
  hashed with its instances (:mod:`hatch_khal.triton.instances`), its variants of the project's
  lock file (:mod:`hatch_khal.triton.lock`) and the Triton version; for a companion crate (option
  ``modules``) the installed library instead of sources (:mod:`hatch_khal.triton.companion`:
  pinned, its version and module files hashed); no Triton run, no import of the author's code;
* :meth:`TritonLanguage.prepare`: every instance compiled for every target by Triton in worker
  processes (:mod:`hatch_khal.triton.worker`; the targets split among ``KHAL_JOBS`` of them),
  through the content-addressed cache; then each
  entry's hash (over its instance, Triton's ``cache_key`` of the kernel and every @triton.jit
  function it calls, and what the compiles found: shared memory), and the kernels renamed
  ``<entry>_khal_<hash>`` in each target's PTX, the instances' PTX merged into one module;
* :meth:`TritonLanguage.jobs`: that module per target: PTX as it is (the fallback, written with
  an explicit older PTX ISA that old drivers JIT), cubins by the ptxas Triton ships
  (:class:`TritonPtxas`, registered as compiler ``triton-ptxas``);
* :meth:`TritonLanguage.finish`: the manifest entries.

An instance's launch attributes come from Triton's metadata (:func:`launch_attributes`): dynamic
shared memory above 48 KB (``Entry.attributes.max_dynamic_shared``: the loader opts the function in
once), ``launch_pdl`` (``pdl``), ``launch_cooperative_grid`` (``cooperative``) and ``num_ctas > 1``
(``cluster_dims = (num_ctas, 1, 1)``: Triton compiles the cluster in, ``.reqnctapercluster``, and a
launch of ``gx`` programs is ``gx * num_ctas`` blocks). The scratch memory a kernel needs per program
(``global_scratch_size`` / ``_align``, ``profile_scratch_*``; on sm_90 a device-side tensor descriptor,
``tl.make_tensor_descriptor``, needs global scratch) goes into its :class:`TritonFacts`, the largest
over the targets; the runtime allocates it (:mod:`khal_runtime.scratch`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from khal_runtime import abi
from khal_runtime.manifest import (Crate, Entry, LaunchAttributes, Param, ServedLibrary, SpirvStatus, TritonCrate, TritonFacts,
                                   TritonParam, TritonScratch)

from hatch_khal import _worker
from hatch_khal.compilers import binary_mismatch
from hatch_khal.__about__ import __version__
from hatch_khal.config import HookConfig, ResolvedCrate, jobs_from_env
from hatch_khal.errors import CompileError, ConfigError, KhalBuildError, SourceChangedError, SourceError, from_name
from hatch_khal.hashing import canonical, crate_content_hash, sha256_bytes
from hatch_khal.languages import BuildRequirement, Compiled, Language, LanguageBase, Planned, Prepared, StubMember
from hatch_khal.model import CompileJob, CompileOutput, CompilerIdentity, CrateParts, PlannedEntry, Reporter
from hatch_khal.reads import changed, cover
from hatch_khal.sources import CrateSources, collect_sources
from hatch_khal.triton import TRITON_REQUIREMENT, TRITON_VERSION, companion, lock
from hatch_khal.triton.companion import Served
from hatch_khal.triton.inspect import inspect_entry
from hatch_khal.triton.stubs import STUB_IMPORTS, stub_members
from hatch_khal.triton.instances import (POINTEE_TYPES, SCALAR_TYPES, TritonArg, TritonInstance, fit, lock_instance,
                                        parse_instances, value_from_json, with_config)
from hatch_khal.triton.knobs import compile_environment
from hatch_khal.triton.ptxas import tool_release
from hatch_khal.triton.reads import TritonReads, content_with_reads

if TYPE_CHECKING:
    from khal_runtime.binaries import BinaryInfo

    from hatch_khal.cache import Cache

__all__ = ["PTXAS", "TRITON", "TRITON_REQUIREMENT", "TRITON_VERSION", "TritonFront", "TritonLanguage", "TritonPlan",
           "TritonPtxas", "merge_ptx", "rename_kernel"]

#: the PTX ISA of a Triton crate's PTX fallback: 8.0 (CUDA 12.0 drivers JIT it; Triton would
#: write its ptxas' newest, 8.7 for 3.6, which the H200's CUDA 13.0 driver does not JIT)
PTX_FALLBACK_VERSION = 80
#: the worker's answer as the cache holds it: 2 records the release of the ptxas Triton used per target,
#: 3 the scratch alignments, 4 the pointers each target's kernel may write, 5 the kernel's parameters,
#: heuristics and module (#36), 6 what the compile read (:mod:`hatch_khal.triton.reads`, #37)
STAGE_FORMAT = 6
NOT_APPLICABLE = SpirvStatus(status="not_applicable", reason="Triton source")
#: the two trailing parameters every Triton kernel takes
SCRATCH_PARAMS = ("khal_global_scratch", "khal_profile_scratch")
_MIN_ARCH = 75


def triton_version() -> str:
    """The installed Triton's version (its metadata: Triton itself is not imported here)."""
    for dist in ("triton", "pytorch-triton"):  # PyPI's, and the wheel PyTorch's own index ships
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise KhalBuildError(f"a Triton crate needs Triton in the build environment: install {TRITON_REQUIREMENT} "
                         "(an isolated build adds it to the build requirements)")


def _ptxas_dir() -> Path:
    spec = util.find_spec("triton")  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise KhalBuildError(f"a Triton crate needs Triton in the build environment: install {TRITON_REQUIREMENT}")
    return Path(spec.origin).parent / "backends" / "nvidia" / "bin"


def ptxas_tool(arch: int) -> tuple[Path, str]:
    """The ptxas Triton itself uses for ``arch`` (and so the one whose newest PTX ISA its PTX was
    written for), with its release: ``TRITON_PTXAS_PATH`` (``TRITON_PTXAS_BLACKWELL_PATH`` for
    sm_100 and newer) when it names a working ptxas, else the one Triton ships; resolved as
    Triton's ``knobs.nvidia.ptxas`` does, without importing Triton. A ptxas Triton did not use
    would refuse Triton's PTX (``Unsupported .version``) or assemble it otherwise."""
    binary = "ptxas-blackwell" if arch >= 100 else "ptxas"
    default = _ptxas_dir() / binary
    env = "TRITON_PTXAS_BLACKWELL_PATH" if arch >= 100 else "TRITON_PTXAS_PATH"
    for path in ([os.environ[env]] if os.environ.get(env) else []) + [str(default)]:
        release = tool_release(path)
        if release is not None:
            return Path(path), release
    raise KhalBuildError(f"a Triton crate's cubins need Triton's {binary}, which does not run here ({default}"
                         f"{'; nor does ' + env + '=' + os.environ[env] if os.environ.get(env) else ''}): "
                         f"reinstall {TRITON_REQUIREMENT}")


def _symbol_names(ptx: str) -> set[str]:
    return set(re.findall(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)",
                          ptx, re.MULTILINE))


def rename_kernel(ptx: str, old: str, new: str) -> str:
    """``ptx`` with its one kernel ``old`` called ``new`` (its ``.entry`` and any other mention of
    the whole name; the parameters' names, ``old_param_0``, stay: they are local to the entry)."""
    if len(re.findall(rf"\.entry\s+{re.escape(old)}\s*\(", ptx)) != 1:
        raise KhalBuildError(f"Triton's PTX does not define kernel {old!r} exactly once")
    return re.sub(rf"(?<![\w$]){re.escape(old)}(?![\w$])", new, ptx)


_HEADER = re.compile(r"^\s*\.(version|target|address_size)\b.*$", re.MULTILINE)
_MODULE_DECL = re.compile(r"^(?:\.visible\s+|\.extern\s+|\.weak\s+)*\.(?:global|const|shared)\b[^;]*?([A-Za-z_$][\w$]*)\s*(?:\[[^\]]*\])*\s*(?:=[^;]*)?;",
                          re.MULTILINE)


def merge_ptx(crate: str, target: str, parts: list[str]) -> str:
    """One PTX module of several Triton kernels (each its own module as Triton writes it): one
    header, identical module-level declarations (``.extern .shared ... global_smem[]``) once, any
    other name defined twice refused."""
    headers = [tuple(m.group(0).strip() for m in _HEADER.finditer(p)) for p in parts]
    if len(set(headers)) != 1:
        raise KhalBuildError(f"crate {crate!r} {target}: Triton wrote its instances' PTX for different targets "
                             f"({sorted(set(headers))})")
    out = ["//", f"// hatch-khal: {len(parts)} Triton kernel(s) of crate {crate}", "//", *headers[0], ""]
    declared: dict[str, str] = {}
    functions: set[str] = set()
    for p in parts:
        body = _HEADER.sub("", p)
        for fn in _symbol_names(body):
            if fn in functions:
                raise KhalBuildError(f"crate {crate!r} {target}: two instances' PTX both define {fn!r}; they cannot "
                                     "share one module (put them in two crates)")
            functions.add(fn)
        lines = []
        for line in body.splitlines():
            m = _MODULE_DECL.match(line.strip())
            if m is not None:
                name = m.group(1)
                if name in declared:
                    if declared[name] != line.strip():
                        raise KhalBuildError(f"crate {crate!r} {target}: two instances' PTX declare {name!r} "
                                             "differently; they cannot share one module (put them in two crates)")
                    continue
                declared[name] = line.strip()
            lines.append(line)
        out.append("\n".join(lines))
    return "\n".join(out) + "\n"


class TritonPtxas:
    """The ``triton-ptxas`` compiler: a Triton crate's merged PTX as it is (``compute_XX``), or
    assembled to a cubin (``sm_XX``) by the ptxas Triton ships, for the PTX's own ``.target``
    (Triton writes ``sm_90a`` for capability 9.0: that cubin runs on sm_90 only)."""

    name = "triton-ptxas"

    def identity(self) -> CompilerIdentity:
        return CompilerIdentity(self.name, f"triton {triton_version()}")

    def supported_archs(self) -> tuple[int, ...]:
        return (75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)

    def compile(self, job: CompileJob) -> CompileOutput:
        start = time.perf_counter()
        want = abi.parse_arch(job.target)
        if want.kind == "compute":
            return CompileOutput(job.text.encode(), "", time.perf_counter() - start, reads=())
        m = re.search(r"^\s*\.target\s+(sm_\w+)", job.text, re.MULTILINE)
        if m is None:
            raise CompileError(f"crate {job.crate!r} {job.target}: the merged Triton PTX names no .target")
        tool, _ = ptxas_tool(want.number)
        with tempfile.TemporaryDirectory(prefix="khal-ptxas-") as tmp:
            src, out = Path(tmp) / f"{job.crate}.ptx", Path(tmp) / f"{job.crate}.cubin"
            src.write_text(job.text)
            run = subprocess.run([str(tool), f"--gpu-name={m.group(1)}", str(src), "-o", str(out)],
                                 capture_output=True, text=True, check=False)
            if run.returncode != 0:
                raise CompileError(f"crate {job.crate!r}: ptxas (Triton's) failed for {job.target}:\n"
                                   f"{run.stderr.strip()}")
            return CompileOutput(out.read_bytes(), run.stderr.strip(), time.perf_counter() - start, reads=())

    def check_output(self, job: CompileJob, data: bytes) -> str | None:
        return binary_mismatch(job, data)


PTXAS = TritonPtxas()


@dataclass(frozen=True)
class TritonPlan:
    """What planning found of a Triton crate: its sources and instances (the lock file's variants
    among them), the targets, Triton's version."""

    sources: CrateSources
    instances: tuple[TritonInstance, ...]
    #: target -> (capability, ptx_version given to Triton or None)
    targets: Mapping[str, tuple[int, int | None]]
    triton: str
    #: per source (``sources.sources``' order): the module it is at run time, inside the wheel's
    #: package (``pkg.ops.rms``), or None when it lies outside the package
    modules: tuple[str | None, ...] = ()
    #: a companion crate: the installed library whose modules are its sources
    served: Served | None = None
    #: the project's root (what the compile read of the project is named relative to)
    root: Path = Path(".")


@dataclass(frozen=True)
class TritonFront:
    """What prepare made: the manifest entries, and the merged PTX of every target."""

    entries: tuple[Entry, ...]
    #: target -> the PTX module of every instance, kernels renamed to their entry symbols
    units: Mapping[str, str]
    #: the crate's own facts (``Crate.triton``), None when it has none to say
    crate: TritonCrate | None = None


TritonPlanned = Planned[TritonPlan, TritonFront]
TritonPrepared = Prepared[TritonPlan, TritonFront]


def _targets(cfg: ResolvedCrate) -> dict[str, tuple[int, int | None]]:
    out: dict[str, tuple[int, int | None]] = {}
    for a in cfg.archs:
        n = abi.parse_arch(a).number
        if n < _MIN_ARCH:
            raise ConfigError(f"crate {cfg.name!r}: Triton compiles for sm_{_MIN_ARCH} and newer, not {a} "
                              "(option 'archs')")
        out[a] = (n, None)
    if cfg.ptx_arch is not None:
        n = abi.parse_arch(cfg.ptx_arch).number
        if n < _MIN_ARCH:
            raise ConfigError(f"crate {cfg.name!r}: Triton writes PTX for compute_{_MIN_ARCH} and newer, not "
                              f"{cfg.ptx_arch} (option 'ptx-arch'; 'none' for no PTX)")
        out[cfg.ptx_arch] = (n, PTX_FALLBACK_VERSION)
    return out


def _refusal(crate: str, inst: TritonInstance, target: str, md: dict[str, Any]) -> str | None:
    where = f"crate {crate!r}: instance {inst.name!r} ({inst.kernel}) for {target}"
    if md["num_ctas"] > abi.MAX_PORTABLE_CLUSTER:
        return (f"{where} has num_ctas={md['num_ctas']}: a cluster of more than {abi.MAX_PORTABLE_CLUSTER} CTAs is "
                "not portable (Triton opts its functions in to non-portable sizes), which hatch-khal does not do; "
                f"use num_ctas={abi.MAX_PORTABLE_CLUSTER} or fewer")
    if md["num_warps"] != inst.num_warps:
        return f"{where}: Triton compiled it with {md['num_warps']} warps, the instance asks for {inst.num_warps}"
    for kind in ("global", "profile"):
        align = int(md.get(f"{kind}_scratch_align", 1))
        if md[f"{kind}_scratch_size"] and (align > 256 or align & (align - 1)):
            return (f"{where} needs {kind} scratch memory aligned to {align} bytes; the runtime's allocations are "
                    "aligned to 256 bytes, and hatch-khal takes a power of two up to that")
    return None


def launch_attributes(mds: list[dict[str, Any]]) -> LaunchAttributes | None:
    """The launch attributes of an instance from Triton's metadata of each of its targets: its
    dynamic shared memory (the largest) as ``max_dynamic_shared`` when above 48 KB (below, every
    launch passes it with no attribute: entries hash as before), PDL and a cooperative grid when
    any target's compile asked for them, and a cluster of ``num_ctas`` CTAs along x (compiled in by
    Triton: ``.reqnctapercluster``) when above 1, its clusters spread over the GPU as Triton's own
    launcher asks (``CU_CLUSTER_SCHEDULING_POLICY_SPREAD``). None when it needs none."""
    shared = max(int(md["shared"]) for md in mds)
    pdl = any(bool(md["launch_pdl"]) for md in mds)
    cooperative = any(bool(md["launch_cooperative_grid"]) for md in mds)
    ctas = max(int(md.get("num_ctas", 1)) for md in mds)
    if shared <= abi.DEFAULT_DYNAMIC_SHARED and not pdl and not cooperative and ctas == 1:
        return None
    return LaunchAttributes(max_dynamic_shared=shared if shared > abi.DEFAULT_DYNAMIC_SHARED else None,
                            pdl=pdl, cooperative=cooperative, cluster_dims=(ctas, 1, 1) if ctas > 1 else None,
                            cluster_scheduling="spread" if ctas > 1 else None)  # as Triton's launcher asks


def written_union(args: tuple[TritonArg, ...] | list[TritonArg], mds: list[dict[str, Any]]) -> tuple[str, ...] | None:
    """The pointer arguments some target's kernel may write (:mod:`hatch_khal.triton.effects`),
    in argument order; None (every pointer written) when a target's analysis gave none."""
    found: set[str] = set()
    for md in mds:
        got = md.get("written")
        if got is None:
            return None
        found.update(got)
    return tuple(a.name for a in args if a.name in found)


def scratch_needs(mds: list[dict[str, Any]], kind: str) -> TritonScratch | None:
    """The ``kind`` ("global" / "profile") scratch memory an instance needs per program, from
    Triton's metadata of each of its targets (the largest size and alignment: one target may need
    none, sm_80 lowering a tensor descriptor to plain loads), or None when no target needs any."""
    size = max(int(md.get(f"{kind}_scratch_size", 0)) for md in mds)
    if not size:
        return None
    return TritonScratch(size=size, align=max(int(md.get(f"{kind}_scratch_align", 1)) for md in mds))


def _params(inst: TritonInstance) -> tuple[Param, ...]:
    out = []
    for a in inst.runtime_args:
        assert a.type is not None
        if a.one:
            continue  # compiled in: not a parameter of this binary
        if a.pointer:
            out.append(Param(name=a.name, kind="scalar", element_type="uint64", element_size=8, element_align=8))
        else:
            t = abi.scalar(SCALAR_TYPES[a.type])
            out.append(Param(name=a.name, kind="scalar", element_type=t.name, element_size=t.size,
                             element_align=t.size))
    for name in SCRATCH_PARAMS:
        out.append(Param(name=name, kind="scalar", element_type="uint64", element_size=8, element_align=8))
    return tuple(out)


def _run_worker(planned: TritonPlanned, jobs: int | None = None) -> dict[str, Any]:
    """Every instance for every target, by Triton in worker processes: up to ``KHAL_JOBS`` (default:
    the CPUs) workers, the targets split among them, and with more workers than targets each
    target's instances split too (:func:`_shares`: a companion of hundreds of recorded variants for
    one arch compiles on every core). The first failure kills the other workers."""
    plan = planned.plan
    crate = planned.cfg.name
    files = [str(f.path) for f in plan.sources.sources]
    targets = [[t, cap, ptx] for t, (cap, ptx) in plan.targets.items()]
    instances = [i.to_json() for i in plan.instances]
    shares = _shares(targets, instances, jobs or jobs_from_env() or os.cpu_count() or 1)
    served = plan.served
    common: dict[str, Any] = {"files": files,
                               # each source's module inside the package (its relative imports resolve there)
                               "source_modules": list(plan.modules) if len(plan.modules) == len(files) else [],
                               "modules": list(served.modules) if served else [],
                               "allowed": list(served.packages) if served else [],
                               "served_root": str(served.root) if served else None,
                               "root": str(plan.root),
                               "crate_files": sorted({os.path.realpath(f.path) for f in planned.files})}
    # each worker compiles with a Triton cache and a temporary folder of its own, in a folder of
    # this build (never the user's TRITON_CACHE_DIR, never ~/.triton: a kernel Triton cached under
    # a key that misses what hatch-khal's covers would come back stale), and Triton compiles every
    # kernel afresh; hatch-khal's cache keeps what the build made
    scratch = tempfile.TemporaryDirectory(prefix="khal-triton-")
    procs = []
    try:
        for n, (share_targets, share_instances) in enumerate(shares):
            own = os.path.join(scratch.name, f"worker-{n}")
            os.makedirs(os.path.join(own, "tmp"))
            env = _worker.environment()
            env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ beside the author's sources
            env.update(TRITON_CACHE_DIR=os.path.join(own, "cache"), TRITON_ALWAYS_COMPILE="1",
                       TMPDIR=os.path.join(own, "tmp"))
            share = {**common, "targets": share_targets, "instances": share_instances, "scratch": own}
            with tempfile.TemporaryFile() as request:  # each worker reads its share at once
                request.write(json.dumps(share).encode())
                request.seek(0)
                proc = subprocess.Popen([sys.executable, "-m", "hatch_khal.triton.worker"], stdin=request,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            procs.append(proc)
        answers = []
        for proc in procs:
            out, err = proc.communicate()
            try:
                answer: dict[str, Any] = json.loads(out)
            except ValueError:
                tail = err.decode("utf-8", "replace")[-3000:]
                raise KhalBuildError(f"crate {planned.cfg.name!r}: the Triton worker failed (exit {proc.returncode}):"
                                     f"\n{tail}") from None
            if not answer.get("ok"):
                raise from_name(str(answer.get("kind")), f"crate {planned.cfg.name!r}: {answer.get('message')}")
            answers.append(answer)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        scratch.cleanup()
    reads = TritonReads.merge(crate, answers)
    _check_unchanged(planned, reads)
    for other in answers[1:]:
        _check_same_kernels(crate, answers[0], other)
    by_name: dict[str, Any] = {}
    for answer in answers:
        for theirs in answer["instances"]:
            mine = by_name.setdefault(theirs["name"], theirs)
            if mine is theirs:
                continue
            if "configs" in mine:
                for c, d in zip(mine["configs"], theirs["configs"]):
                    c["targets"].update(d["targets"])
            else:
                mine["targets"].update(theirs["targets"])
    merged = answers[0]
    merged["reads"] = reads.as_json()
    merged["instances"] = [by_name[i["name"]] for i in instances]  # the crate's order, whoever compiled them
    return merged


def _shares(targets: list[Any], instances: list[Any], jobs: int) -> list[tuple[list[Any], list[Any]]]:
    """The workers' shares (targets, instances): the targets dealt among up to ``jobs`` workers,
    each compiling every instance; or, with more jobs than targets, each target's instances dealt
    among ``jobs // targets`` workers (at most one per instance)."""
    if jobs <= len(targets) or len(instances) <= 1:
        n = max(1, min(jobs, len(targets)))
        return [(targets[i::n], instances) for i in range(n)]
    per = min(len(instances), jobs // len(targets))
    return [([t], instances[i::per]) for t in targets for i in range(per)]


def _check_unchanged(planned: TritonPlanned, reads: TritonReads) -> None:
    """SourceChangedError naming a file of the crate, or a project file its compile read, that
    changed since it was hashed or read (during a compile, between two workers' imports)."""
    for f in cover(planned.files):
        why = changed(f)
        if why is not None:
            raise SourceChangedError(f"crate {planned.cfg.name!r}: {f.key} changed while Triton compiled the crate "
                                     f"({why}); nothing was cached: build again")
    reads.check_unchanged(planned.cfg.name, planned.plan.root)


def _check_same_kernels(crate: str, one: dict[str, Any], other: dict[str, Any]) -> None:
    """Two workers' answers describe the same kernels where they compiled the same instances (each
    imported the crate itself): else a source changed between their imports, which
    :func:`_check_unchanged` names when it can (workers given other instances are compared there,
    by what each read)."""
    mine = {i["name"]: i["cache_key"] for i in one["instances"]}
    theirs = {i["name"]: i["cache_key"] for i in other["instances"]}
    names = sorted(n for n in mine.keys() & theirs.keys() if mine[n] != theirs[n])
    if names:
        raise SourceChangedError(f"crate {crate!r}: the Triton workers compiled different sources of "
                                 f"{', '.join(names)} (a source changed between their imports); "
                                 "nothing was cached: build again")


def _with_reads(p: TritonPlanned, answer: dict[str, Any]) -> TritonPlanned:
    """The crate once its compile's reads are known: its content hash over them too, and the project
    files read among its files (its manifest ``sources``)."""
    reads = TritonReads.from_record(answer["reads"])
    files = {f.rel: f for f in p.files}
    for f in reads.files(p.cfg.name, p.plan.root):
        files.setdefault(f.rel, f)
    return replace(p, content_hash=content_with_reads(p.content_hash, reads),
                   files=tuple(files[k] for k in sorted(files)))


def _variants(instances: tuple[TritonInstance, ...], by_name: Mapping[str, Any]
              ) -> list[tuple[TritonInstance, dict[str, Any], dict[str, Any]]]:
    """Each entry to make: (its instance, the worker's answer for it, its autotune facts). An
    instance with ``autotune`` becomes one ``<name>__c<j>`` per config of the kernel's autotuner,
    the config's kwargs among its constexprs, its warps and stages, in the instance's family."""
    out: list[tuple[TritonInstance, dict[str, Any], dict[str, Any]]] = []
    for inst in instances:
        got = by_name[inst.name]
        if not inst.autotune:
            tune = {} if inst.config is None else {"config": inst.config, "autotune_key": tuple(got["autotune_key"])}
            out.append((inst, got, tune))
            continue
        for c in got["configs"]:
            variant = with_config(inst, got["arg_names"], c["index"],
                                  {k: value_from_json(v) for k, v in c["constexprs"].items()}, c["num_warps"],
                                  c["num_stages"], c["num_ctas"], c["maxnreg"])
            out.append((variant, {**got, "targets": c["targets"]},
                        {"config": c["index"], "autotune_key": tuple(got["autotune_key"]), "choose": inst.choose}))
    return out


def _lock_instances(root: Path, cfg: ResolvedCrate, taken: set[str]) -> tuple[list[TritonInstance], list[str]]:
    """The lock file's variants of crate ``cfg`` as instances (named ``<kernel>__v<hash>``, sorted by
    kernel and canonical JSON: the file's order does not matter), and their canonical JSON (what the
    crate's content hash covers of the lock file). A variant naming a crate that is not a Triton
    crate of this build is refused, naming the crates there are."""
    path = root / cfg.triton_lock
    if not path.is_file():
        if cfg.triton_lock_explicit:
            raise ConfigError(f"option 'triton-lock' names {cfg.triton_lock}, which is not a file of the project "
                              f"({root}): record the variants first (python -m hatch_khal triton record -- <command>) "
                              "or drop the option")
        return [], []
    variants = lock.read(path)
    crates = cfg.language_crates or [cfg.name]
    mine: dict[str, tuple[str, TritonInstance]] = {}
    for i, v in enumerate(variants):
        if v.crate not in crates:
            raise ConfigError(f"{path}: variant[{i}] ({v.kernel}) names crate {v.crate!r}, which is not a Triton crate "
                              f"of this build (its Triton crates: {', '.join(crates)}); rename the crate in the lock "
                              "file or delete the variant")
        if v.crate != cfg.name:
            continue
        name = lock.entry_name(v)
        origin = f"{path}: variant[{i}] ({name})"
        if v.module is not None and not cfg.modules:
            raise ConfigError(f"{origin}: field 'module' is for a crate whose sources are modules (crate option "
                              f"'modules'); crate {cfg.name!r} has 'sources'")
        if name in taken:
            raise ConfigError(f"{origin}: entry name {name!r} is also an instance's of crate {cfg.name!r}")
        text = lock.canonical_json(v)
        if name in mine and mine[name][0] != text:
            raise ConfigError(f"{origin}: two different variants of the lock file make entry {name!r} (the other is "
                              f"{mine[name][1].origin}); record them again")
        mine.setdefault(name, (text, lock_instance(v, name, origin)))
    ordered = sorted(mine.values(), key=lambda t: (t[1].kernel, t[0]))
    return [inst for _, inst in ordered], [text for text, _ in ordered]


def _crate_facts(p: TritonPlanned, served_files: set[str]) -> TritonCrate | None:
    """``Crate.triton``: option ``jit-fallback``, and for a companion crate the library it serves (its
    distribution, version, and the digest of each of its files the kernels' modules and the
    @triton.jit functions they call are). None when there is nothing to say."""
    served = p.plan.served
    library = None
    if served is not None:
        files = dict(served.digests)
        for rel in sorted(served_files - set(files)):
            files[rel] = served.digest(rel)
        library = ServedLibrary(distribution=served.distribution, version=served.version, files=dict(sorted(files.items())))
    if library is None and not p.cfg.jit_fallback:
        return None
    return TritonCrate(jit_fallback=p.cfg.jit_fallback, serves=library)


def _source_modules(root: Path, cfg: ResolvedCrate, sources: CrateSources) -> tuple[str | None, ...]:
    """Per source, the module it is inside the wheel's package (``cfg.package``; its last folder is
    the import name): ``pkg.ops.rms`` for ``<package>/ops/rms.py``; None for a source outside the
    package or under a folder that is no identifier."""
    package = (root / cfg.package).resolve()
    out: list[str | None] = []
    for f in sources.sources:
        try:
            rel = f.path.resolve().relative_to(package)
        except ValueError:
            out.append(None)
            continue
        parts = [package.name, *rel.parts[:-1]] + ([] if rel.stem == "__init__" else [rel.stem])
        out.append(".".join(parts) if all(p.isidentifier() for p in parts) else None)
    return tuple(out)


class TritonLanguage(LanguageBase):
    name = "triton"
    title = "Triton"
    suffixes: tuple[str, ...] = (".py",)
    #: ``modules``: a companion crate serving an installed library's kernels, without ``sources``
    crate_options = frozenset({"instances", "modules", "jit-fallback"})
    compiled_by = "Triton (its ptxas)"
    compiler = "triton-ptxas"
    stub_imports: tuple[tuple[str, str], ...] = STUB_IMPORTS

    def requirements(self, crates: Sequence[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
        # Triton compiles with its own ptxas: no NVRTC
        def probe() -> str | None:
            return None if util.find_spec("triton") is not None else "a Triton crate needs Triton in the build environment"

        return [BuildRequirement(TRITON_REQUIREMENT, probe, label="it",
                                 note=f"Triton crates are built with {TRITON_REQUIREMENT!r}")]

    def stub_members(self, crate: Crate) -> list[StubMember] | None:
        return stub_members(crate)

    def inspect_entry(self, entry: Entry) -> tuple[str | None, list[str]]:
        return inspect_entry(entry)

    def plan(self, root: Path, cfg: ResolvedCrate) -> TritonPlanned:
        instances = parse_instances(cfg.name, cfg.instances or None)
        recorded, lock_record = _lock_instances(root, cfg, {i.name for i in instances})
        instances += recorded
        if not instances:
            raise ConfigError(f"crate {cfg.name!r}: a Triton crate needs variants to build: 'instances' tables naming "
                              f"each @triton.jit kernel and its signature, or variants of the crate in the lock file "
                              f"({cfg.triton_lock}: python -m hatch_khal triton record -- <command>); see "
                              "docs/guide/triton.md")
        served = companion.resolve(root, cfg.name, list(cfg.modules)) if cfg.modules else None
        sources = (CrateSources(sources=[]) if served is not None else
                   collect_sources(root, cfg.name, cfg.sources, list(cfg.include_dirs)))
        bad = [s.rel for s in sources.sources if s.path.suffix != ".py"]
        if bad:
            raise ConfigError(f"crate {cfg.name!r}: option 'sources' matches {', '.join(bad)}: a Triton crate's "
                              "sources are .py files")
        if cfg.options or cfg.defines:
            raise ConfigError(f"crate {cfg.name!r}: options 'options' and 'defines' are for CUDA C++ crates; a Triton "
                              "instance takes num_warps and num_stages (see docs/guide/triton.md)")
        version = triton_version()
        targets = _targets(cfg)
        # Triton's knobs (TRITON_DEFAULT_FP_FUSION, TRITON_F32_DEFAULT, ...) and every variable it says
        # invalidates its cache (DISABLE_LLVM_OPT, ...) change what it compiles
        knobs = compile_environment(version, _worker.environment())
        # the ptxas releases: Triton writes the newest PTX ISA its ptxas takes, and assembles with it
        ptxas = sorted({ptxas_tool(abi.parse_arch(t).number)[1] for t in targets})
        extra: dict[str, Any] = {}
        if lock_record:  # only this crate's variants: another crate's do not rebuild it
            extra["lock"] = lock_record
        if served is not None:
            extra["served"] = served.record()
        content = crate_content_hash(sources.all_files, {}, [], {
            "language": "triton", "triton": version, "instances": [i.record() for i in instances],
            "ptx_fallback": PTX_FALLBACK_VERSION, "knobs": knobs, "ptxas": ptxas, **extra})
        return Planned(cfg=cfg, language=self, content_hash=content, spirv=NOT_APPLICABLE,
                       files=tuple(sources.all_files), tools={"triton": version},
                       plan=TritonPlan(sources=sources, instances=tuple(instances), targets=targets, triton=version,
                                       modules=_source_modules(root, cfg, sources), served=served, root=root))

    def prepare(self, p: TritonPlanned, cache: Cache, reporter: Reporter) -> TritonPrepared:
        if p.prebuilt_var:
            raise ConfigError(f"crate {p.cfg.name!r}: {p.prebuilt_var} gives a prebuilt binary, which Triton crates "
                              "do not take (their entries come from Triton's compiles); unset it")
        key = sha256_bytes(canonical({"what": "triton-stage", "format": STAGE_FORMAT, "content": p.content_hash,
                                      "targets": sorted(p.plan.targets.items()), "hatch_khal": __version__}))
        compiled = 0
        hit = cache.lookup(key)
        answer = None
        if hit is not None:
            try:
                answer = json.loads(hit.data)
            except ValueError:
                cache.drop(key, f"not the Triton output of crate {p.cfg.name!r}; rebuilding it")
            else:
                why = TritonReads.from_record(answer["reads"]).stale(p.plan.root) if "reads" in answer else "no reads"
                if why is not None:
                    reporter.info(f"khal: Triton crate {p.cfg.name!r}: {why}; compiling it again")
                    answer = None
        if answer is None:
            with cache.locked([key]):
                reporter.info(f"khal: compiling Triton crate {p.cfg.name!r}: {len(p.plan.instances)} instance(s) x "
                              f"{len(p.plan.targets)} target(s)")
                start = time.perf_counter()
                answer = _run_worker(p)
                cache.store(key, json.dumps(answer).encode(), "")
                compiled = 1
                reporter.info(f"khal: compiled Triton crate {p.cfg.name!r} in {time.perf_counter() - start:.2f}s")
        p = _with_reads(p, answer)
        front = self._entries(p, answer)
        return p.prepared(front, entries=[PlannedEntry(e.name, e.hash) for e in front.entries], compiled=compiled,
                          cached=1 - compiled)

    def _entries(self, p: TritonPlanned, answer: dict[str, Any]) -> TritonFront:
        """The manifest entries of the crate's instances, from Triton's answer, and the merged PTX of
        every target."""
        by_name = {i["name"]: i for i in answer["instances"]}
        entries: list[Entry] = []
        per_target: dict[str, list[str]] = {t: [] for t in p.plan.targets}
        served: set[str] = set()
        for written, got, tune in _variants(p.plan.instances, by_name):
            inst, where = self._fitted(p, written, got)
            served.update(got.get("served", []))
            for target, md in got["targets"].items():
                why = _refusal(p.cfg.name, inst, target, md)
                if why is not None:
                    raise ConfigError(why)
                used = md.get("ptxas")
                tool, ours = ptxas_tool(abi.parse_arch(target).number)
                if used is not None and used != ours:
                    raise CompileError(f"crate {p.cfg.name!r}: Triton wrote {target} PTX for ptxas {used}, but the "
                                       f"cubins would be assembled by ptxas {ours} ({tool}): set TRITON_PTXAS_PATH "
                                       "to the one Triton should use")
            mds = list(got["targets"].values())
            ctas = max(int(md["num_ctas"]) for md in mds)
            facts = TritonFacts(kernel=inst.kernel, family=inst.family, base=inst.base, num_warps=inst.num_warps,
                                num_stages=inst.num_stages,
                                shared=max(md["shared"] for md in got["targets"].values()),
                                names=tuple(a.name for a in inst.runtime_args),
                                types=tuple(a.type for a in inst.runtime_args if a.type is not None),
                                divisible=tuple(inst.divisible()), ones=tuple(inst.ones()),
                                constexprs=inst.constexprs(),
                                cache_key=got["cache_key"], triton_version=answer["triton"],
                                num_ctas=ctas if ctas > 1 else None,
                                global_scratch=scratch_needs(mds, "global"),
                                profile_scratch=scratch_needs(mds, "profile"),
                                written=written_union(inst.runtime_args, mds), **where, **tune)
            params = _params(inst)
            block = (inst.num_warps * 32, 1, 1)
            attributes = launch_attributes(mds)
            # Triton grids have up to three axes of programs (tl.program_id(0..2))
            sig = abi.entry_signature(inst.name, block, params, grid_dims=3, attributes=attributes,
                                      triton=facts.record())
            h = abi.entry_hash(p.content_hash, sig)
            symbol = abi.symbol_for(inst.name, h)
            entries.append(Entry(name=inst.name, symbol=symbol, hash=h, block_size=block, params=params,
                                 grid_dims=3, attributes=attributes, triton=facts))
            for target, md in got["targets"].items():
                per_target[target].append(rename_kernel(md["ptx"], md["name"], symbol))
        return TritonFront(entries=tuple(entries),
                           units={t: merge_ptx(p.cfg.name, t, parts) for t, parts in per_target.items()},
                           crate=_crate_facts(p, served))

    def _fitted(self, p: TritonPlanned, inst: TritonInstance, got: dict[str, Any]
                ) -> tuple[TritonInstance, dict[str, Any]]:
        """``inst`` fitted to its kernel's parameters as the worker read them (the worker fitted it
        the same way before compiling it), and the facts of the kernel every variant of it shares:
        its parameters, heuristics, and where it is importable at run time."""
        params = tuple(TritonParam.model_validate(x) for x in got["params"])
        module: str | None = got.get("module")
        if module is None and got.get("source") is not None and p.plan.modules:
            module = p.plan.modules[got["source"]]
        fitted = fit(inst, params)
        return fitted, {"params": params, "nones": tuple(fitted.nones()), "heuristics": tuple(got.get("heuristics", ())),
                        "maxnreg": fitted.maxnreg, "recorded": fitted.recorded, "module": module,
                        "qualname": fitted.kernel if module is not None else None}

    def jobs(self, p: TritonPrepared, root: Path, targets: list[str]) -> list[CompileJob]:
        ident = PTXAS.identity()
        entries = tuple((e.name, e.hash) for e in p.entries)
        jobs = []
        for target in targets:
            unit = p.front.units[target]
            key = sha256_bytes(canonical({"what": "triton-unit", "unit": sha256_bytes(unit.encode()), "arch": target,
                                          "compiler": [ident.name, ident.version], "hatch_khal": __version__}))
            jobs.append(CompileJob(crate=p.cfg.name, target=target, compiler=PTXAS.name, text=unit,
                                   name=f"{p.cfg.name}.triton.ptx", options=(), key=key, covered=cover(p.files),
                                   entries=entries))
        return jobs

    def explain(self, p: TritonPrepared, error: KhalBuildError) -> KhalBuildError:
        return error

    def finish(self, p: Compiled[TritonPlan, TritonFront], binary: BinaryInfo) -> CrateParts:
        missing = [e.symbol for e in p.front.entries if e.symbol not in binary.functions]
        if missing:
            raise KhalBuildError(f"crate {p.cfg.name!r}: the binary lacks kernel(s) {', '.join(missing)}")
        return CrateParts(entries=p.front.entries, triton=p.front.crate)


TRITON: Language[TritonPlan, TritonFront] = TritonLanguage()
