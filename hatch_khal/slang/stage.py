"""The Slang stage: the two calls the builder makes for a crate of ``.slang`` sources.

* :func:`plan_slang_crate` (no Slang run): the crate's files, content hash and cache keys;
* :func:`compile_slang_crate` (one worker process): Slang compiles the module to CUDA source, the
  entries are read from reflection and hashed, each entry is compiled alone to WGSL and SPIR-V
  under its symbol, and the CUDA source becomes a khal-ABI translation unit for NVRTC.

An unchanged rebuild needs neither: the builder keeps :meth:`SlangOutput.to_bytes` under
:meth:`SlangPlan.cache_key` and hands the unit to NVRTC, whose own cache key covers the text.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from khal_runtime.manifest import Entry, Param, StructLayout

from hatch_khal.errors import CompileError, ConfigError, KhalBuildError, SourceError
from hatch_khal.hashing import crate_content_hash
from hatch_khal.slang.client import SlangCrashed, WorkerClient
from hatch_khal.slang.cuda_abi import CODEGEN_VERSION, build_cuda_unit, nvrtc_options
from hatch_khal.slang.entries import (WEBGPU_WORKGROUP_LIMIT, SlangEntry, entries_from_reflection,
                                      non_compute_error, refuse_cuda_only_types, webgpu_target)
from hatch_khal.slang.library import SlangNotFound, find_slang
from hatch_khal.slang.locate import Locator
from hatch_khal.slang.records import ALL_TARGETS, SlangOutput, SlangPlan, normalize_targets, webgpu_path
from hatch_khal.slang.sources import collect_slang_sources

__all__ = ["ALL_TARGETS", "SlangOutput", "SlangPlan", "compile_slang_crate", "plan_slang_crate"]

#: Slang options the stage sets itself, or that make Slang compile nothing (then crash on read-back).
_FORBIDDEN_OPTIONS = ("-target", "-entry", "-stage", "-o", "-profile", "-fvk-use-entrypoint-name",
                      "-r", "-reflection-json", "-output", "-pass-through")


def _check_slang_options(crate: str, options: list[str]) -> None:
    for o in options:
        if not isinstance(o, str) or not o:
            raise ConfigError(f"crate {crate!r}: Slang option {o!r} is not a non-empty string")
        name = o.split("=", 1)[0]
        if name in _FORBIDDEN_OPTIONS:
            raise ConfigError(f"crate {crate!r}: Slang option {o!r} is set by the khal hook itself; remove it "
                              "(targets come from the build, entries from [shader(\"compute\")])")
        if o.endswith(".slang"):
            raise ConfigError(f"crate {crate!r}: Slang option {o!r} looks like a file; list sources in "
                              "'sources' and module folders in 'include-dirs'")


def plan_slang_crate(
    root: Path,
    crate_name: str,
    patterns: list[str],
    include_dirs: list[str | Path],
    defines: dict[str, str],
    options: list[str],
    slang_options: list[str] = (),  # type: ignore[assignment]
    *,
    finder: Callable[[str], Any] | None = None,
) -> SlangPlan:
    """The crate's files and hashes, without running Slang.

    ``patterns``: globs of ``.slang`` files under ``root``; ``include_dirs``: module folders (Slang's
    ``-I``), relative to ``root``; ``defines``: preprocessor defines for Slang; ``options``: NVRTC
    options (after the defaults ``-std=c++17 -diag-suppress=1444,222,177 --fmad=false``);
    ``slang_options``: extra Slang options (``-O3``, ``-warnings-as-errors ...``). ``finder``
    replaces :func:`importlib.util.find_spec` when locating slangpy (tests).
    Raises SlangNotFound (no slangpy), ConfigError, SourceError."""
    root = Path(root).resolve()
    slang = find_slang(finder)
    dirs: list[Path] = []
    for d in include_dirs:
        p = (root / d).resolve()
        if not p.is_dir():
            raise ConfigError(f"crate {crate_name!r}: include dir {str(d)!r} (option 'include-dirs') is not a directory")
        dirs.append(p)
    _check_slang_options(crate_name, list(slang_options))
    files = collect_slang_sources(root, crate_name, patterns, dirs)
    rel_dirs = [str(d) for d in include_dirs]
    content = crate_content_hash(files.all_files, dict(defines), nvrtc_options(list(options)), {
        "language": "slang",
        "slang": slang.version,
        "slang_options": list(slang_options),
        "include_dirs": rel_dirs,
        "codegen": CODEGEN_VERSION,
    })
    return SlangPlan(crate=crate_name, root=root, files=files, include_dirs=tuple(dirs), defines=dict(defines),
                     options=tuple(options), slang_options=tuple(slang_options), slang=slang, content_hash=content)


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix() or "."
    except ValueError:
        return str(path)


def _diagnostics_error(plan: SlangPlan, stage: str, diagnostics: str) -> KhalBuildError:
    text = diagnostics.strip() or "no diagnostics"
    if stage == "options":
        return ConfigError(f"crate {plan.crate!r}: {text}; check the crate's Slang options")
    if stage == "setup":
        return KhalBuildError(f"crate {plan.crate!r}: the Slang worker could not start: {text}")
    return CompileError(f"crate {plan.crate!r} failed to compile with Slang{stage}:\n{text}")


def _check_dependencies(plan: SlangPlan, deps: list[str]) -> None:
    """Every file Slang read must be one the content hash covers (else an edit would not rebuild)."""
    known = {f.path.resolve() for f in plan.files.all_files}
    slang_dir = plan.slang.library.parent.resolve()
    for d in deps:
        p = (plan.root / d).resolve()
        if p in known or slang_dir in p.parents:
            continue
        if not p.exists():
            continue  # virtual files (Slang's built-in modules)
        raise SourceError(
            f"crate {plan.crate!r}: Slang read {d}, which the hook's module scan did not find, so an edit "
            "to it would not trigger a rebuild. Reference it with a plain `import name;`, "
            "`import \"file.slang\";` or `#include \"file\"` from a source of the crate"
        )


def _non_compute_entries(plan: SlangPlan, request: dict[str, Any], locator: Locator) -> SourceError | None:
    """After the CUDA compile failed or crashed: the error naming the crate's vertex / fragment / ...
    entries, if it has any (Slang compiles every [shader] entry, and CUDA takes compute ones only);
    None otherwise, or if the entries cannot be listed (the original error stands)."""
    try:
        with WorkerClient(plan.crate, plan.slang.version) as worker:
            answer = worker.ask({**request, "list_stages": True}, "listing the crate's entry points")
    except KhalBuildError:
        return None
    if not answer.get("ok"):
        return None
    return non_compute_error(plan.crate, [(str(n), int(s)) for n, s in answer.get("stages", [])], locator)


def _warnings(plan: SlangPlan, what: str, diagnostics: str) -> list[str]:
    text = diagnostics.strip()
    return [f"crate {plan.crate!r} ({what}): Slang says:\n{text}"] if text else []


def compile_slang_crate(plan: SlangPlan, targets: Iterable[str] = ALL_TARGETS) -> SlangOutput:
    """Compile one Slang crate (see the module docstring). ``targets`` without "wgsl" / "spirv" is
    the ``KHAL_SKIP_SPIRV`` build: no WebGPU artifact is compiled at all.

    Raises CompileError (Slang's diagnostics, with file:line; a crashed compiler is
    :class:`~hatch_khal.slang.client.SlangCrashed`), SourceError (an entry the ABI cannot take:
    file, entry and parameter named), ConfigError (options), SlangNotFound."""
    wanted = normalize_targets(targets)
    webgpu = [t for t in ("wgsl", "spirv") if t in wanted]
    files = plan.files.all_files
    locator = Locator([(f.rel, f.text) for f in plan.files.sources + plan.files.modules], plan.crate)
    t0 = time.perf_counter()
    request = {
        "crate": plan.crate, "root": str(plan.root),
        "sources": [{"rel": f.rel, "text": f.text} for f in plan.files.sources],
        # relative to the project (the worker runs there): no build-machine path in #line or messages
        "search_paths": [_relative(d, plan.root) for d in plan.include_dirs],
        "defines": plan.defines, "slang_options": list(plan.slang_options),
    }
    warnings: list[str] = []
    timings: dict[str, float] = {}
    with WorkerClient(plan.crate, plan.slang.version) as worker:
        try:
            first = worker.ask(request, "compiling the crate to CUDA source")
        except SlangCrashed as exc:
            raise _non_compute_entries(plan, request, locator) or exc
        if not first.get("ok"):
            if first.get("error") == "SlangNotFound":
                raise SlangNotFound(first.get("diagnostics", ""))
            stage = first.get("stage", "cuda")
            error = _diagnostics_error(plan, "" if stage == "cuda" else stage, first.get("diagnostics", ""))
            raise (_non_compute_entries(plan, request, locator) if stage == "cuda" else None) or error
        timings["session"] = first.get("session_seconds", 0.0)
        timings["cuda"] = first.get("seconds", 0.0)
        warnings += _warnings(plan, "CUDA", first.get("diagnostics", ""))
        _check_dependencies(plan, first.get("dependencies", []))
        entries = entries_from_reflection(plan.crate, first["entries"], first.get("globals", []),
                                          plan.content_hash, locator)
        if not entries:
            raise SourceError(
                f"crate {plan.crate!r}: no entry point in {', '.join(f.rel for f in plan.files.sources)}; mark "
                "kernels with [shader(\"compute\")] and [numthreads(X, Y, Z)]"
            )
        refuse_cuda_only_types(plan.crate, entries, locator, webgpu)
        jobs = [{"entry": e.name, "symbol": e.symbol, "targets": webgpu} for e in entries] if webgpu else []
        second = worker.ask({"webgpu": jobs}, "compiling entries to WGSL / SPIR-V")
    for r in second.get("results", []):
        if not r["ok"]:
            raise _diagnostics_error(plan, f" to {r['target'].upper()} (entry {r['entry']!r}; set "
                                     "KHAL_SKIP_SPIRV=1 for a CUDA-only build)", r.get("diagnostics", ""))
        timings[f"{r['entry']}.{r['target']}"] = r.get("seconds", 0.0)
        warnings += _warnings(plan, f"{r['target']} of {r['entry']}", r.get("diagnostics", ""))
    timings["worker"] = time.perf_counter() - t0
    unit = build_cuda_unit(plan.crate, first["code"], first.get("prelude_chars", -1), entries, list(plan.options))
    manifest_entries, wfiles = _finish_entries(plan, entries, second.get("results", []), locator, warnings)
    return SlangOutput(
        crate=plan.crate, content_hash=plan.content_hash, slang_version=first.get("version", plan.slang.version),
        targets=wanted, cuda_unit=unit.text, unit_name=f"{plan.crate}.slang.cu", nvrtc_options=tuple(unit.options),
        entries=manifest_entries, webgpu_files=wfiles, warnings=tuple(warnings), timings=timings,
        system_includes=unit.system_includes,
    )


def _finish_entries(plan: SlangPlan, entries: list[SlangEntry], results: list[dict[str, Any]],
                    locator: Locator, warnings: list[str]) -> tuple[tuple[Entry, ...], dict[str, bytes]]:
    by_key = {(r["entry"], r["target"]): r for r in results}
    files: dict[str, bytes] = {}
    out = []
    for e in entries:
        targets = []
        layouts: dict[str, dict[str, StructLayout]] = {}
        for target in ("wgsl", "spirv"):
            r = by_key.get((e.name, target))
            if r is None:
                continue
            refl = r.get("entries") or []
            if len(refl) != 1:
                raise KhalBuildError(f"crate {plan.crate!r}: the {target} compile of entry {e.name!r} "
                                     f"reflected {len(refl)} entry points, not one")
            path = webgpu_path(plan.crate, e.name, e.hash, target)
            wt, lay = webgpu_target(plan.crate, e, target, refl[0], path, locator)
            targets.append(wt)
            files[path] = base64.b64decode(r["code"])
            for name, layout in lay.items():
                layouts.setdefault(name, {})[target] = layout
        if targets and e.threads > WEBGPU_WORKGROUP_LIMIT:
            warnings.append(
                f"{e.where}: crate {plan.crate!r}: entry {e.name!r} runs {e.threads} threads per group; WebGPU "
                f"allows {WEBGPU_WORKGROUP_LIMIT} by default (maxComputeInvocationsPerWorkgroup): the WebGPU "
                "backend must request a higher limit from the adapter"
            )
        params = tuple(
            p if p.name not in layouts else Param.model_validate(
                {**p.model_dump(), "layouts": {**(p.layouts or {}), **layouts[p.name]}})
            for p in e.params
        )
        out.append(Entry(name=e.name, symbol=e.symbol, hash=e.hash, block_size=e.block_size, params=params,
                         indirect_symbol=e.indirect_symbol, grid_dims=e.grid_dims,
                         webgpu=tuple(targets) if targets else None))
    return tuple(out), files


def slang_available() -> bool:
    """Whether the slangpy wheel (and its Slang library) is installed here."""
    try:
        find_slang()
    except SlangNotFound:
        return False
    return True

