"""The Triton stage's worker: ``python -m hatch_khal.triton.worker`` imports a crate's ``.py``
sources with Triton and compiles every instance for every target, in a process of its own (the
crate's modules are the author's code: they are never imported into the hook's process).

It reads one JSON request on stdin and writes one JSON answer on stdout:

* request: ``{"files": [abs path, ...], "modules": [module name, ...], "allowed": [folder, ...],
  "served_root": folder or null, "instances": [TritonInstance.to_json(), ...], "targets":
  [[target, capability, ptx_version or null], ...]}``: the crate's sources (files, loaded by path) or
  the installed modules a companion crate serves (imported by name; ``allowed``: the folders of its
  library, whose @triton.jit helpers the library's pinned version covers; ``served_root``: the
  library's install root, against which its files are named), and the instances (hand-written or
  from the lock file, :mod:`hatch_khal.triton.instances`); ``"root"``: the project root, ``"crate_files"``:
  every file the crate's content hash covers (real paths), ``"scratch"``: the folder of the worker's own
  files (Triton's cache, the temporary folder);
* answer: ``{"ok": true, "triton": version, "instances": [{"name", "cache_key", "deps": [file...],
  "arg_names", "params": [TritonParam...], "heuristics": [name...], "source": index in files or
  null, "module": module name or null, "served": [file relative to served_root...],
  "targets": {target: {"ptx", "name", "shared", "num_warps", "num_ctas",
  "global_scratch_size", "global_scratch_align", "profile_scratch_size", "profile_scratch_align",
  "launch_pdl", "launch_cooperative_grid", "written"}}}]}``,
  or ``{"ok": false, "kind": error class name, "message": ...}``. An instance with ``autotune``
  answers ``"configs": [{"index", "constexprs", "num_warps", "num_stages", "num_ctas", "maxnreg",
  "targets"}, ...]`` (one per ``triton.Config`` of the kernel's ``@triton.autotune``) and
  ``"autotune_key"`` instead of ``"targets"``; a lock variant that ran a config, ``"autotune_key"``
  beside its ``"targets"``.

Each instance is checked against the kernel's parameters (:func:`hatch_khal.triton.instances.fit`:
which are constexprs is the kernel's ``is_constexpr``), then compiled with Triton's own signature,
constants (``tl.dtype`` values as Triton's dtypes, None arguments as constexpr None) and options
(``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``).

A kernel may be decorated with ``@triton.autotune`` and ``@triton.heuristics`` (Triton's
``Autotuner`` / ``Heuristics``): the worker unwraps them to the ``@triton.jit`` function, whose
``cache_key`` the entry hash covers as for a plain one. A heuristic's constexpr must be given by
the instance (the runtime has no Triton to run the heuristic); an autotuner's configs are built
only for ``autotune = true``; its host hooks (``reset_to_zero``, ``restore_value``, ``pre_hook`` /
``post_hook``, ``prune_configs_by``) only with a rule (``choose``), a config's ``pre_hook`` never.

Everything the worker imports and opens from the start of the crate's import to the end of its
compiles is recorded by an audit hook (:mod:`hatch_khal.triton.audit`): Triton and the worker's own
modules are imported before it is armed. Triton compiles every kernel afresh (``TRITON_ALWAYS_COMPILE``,
a cache folder of the build's own): nothing comes from another build's cache, and every compile's reads
are seen.

Line info is off (``TRITON_DISABLE_LINE_INFO``): no build-machine path reaches the binaries, and
the PTX of several instances merges into one module without clashing ``.file`` tables.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import sys
import types
from typing import Any

from hatch_khal.triton.audit import Audit


class _Refused(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _load(path: str, index: int, dotted: str | None = None) -> Any:
    """The source at ``path``, executed as a module: as ``dotted`` (its module inside the package)
    when it has one, so that its relative imports (``from .utils import ...``) find its siblings;
    the package folders above it stand in as bare packages (their ``__init__`` would import the
    kernels this build makes). Else under a name of its own."""
    path = os.path.abspath(path)
    is_init = os.path.basename(path) == "__init__.py"
    name = dotted or f"_khal_triton_src_{index}_{os.path.splitext(os.path.basename(path))[0]}"
    if dotted is not None:
        # the parents, innermost first (pkg.ops, then pkg), each with its folder
        folder = os.path.dirname(os.path.dirname(path) if is_init else path)
        parts = dotted.split(".")
        for n in range(len(parts) - 1, 0, -1):
            parent = ".".join(parts[:n])
            if parent not in sys.modules:
                stand_in = types.ModuleType(parent)
                stand_in.__path__ = [folder]
                stand_in.__package__ = parent
                sys.modules[parent] = stand_in
            folder = os.path.dirname(folder)
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[os.path.dirname(path)] if dotted is not None and is_init else None)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _deps(fn: Any, jit: type, seen: dict[int, str]) -> None:
    """Every @triton.jit function ``fn`` calls (by a global name or module attribute), recursively:
    id -> its source file."""
    if id(fn) in seen:
        return
    seen[id(fn)] = inspect.getsourcefile(fn.fn) or "<unknown>"
    scope = dict(fn.__globals__)
    scope.update(inspect.getclosurevars(fn.fn).nonlocals)
    for node in ast.walk(ast.parse(fn.src)):
        obj: Any = None
        if isinstance(node, ast.Name):
            obj = scope.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            obj = getattr(scope.get(node.value.id), node.attr, None)
        if isinstance(obj, jit):
            _deps(obj, jit, seen)


def _compile(req: dict[str, Any]) -> dict[str, Any]:
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    # lazy: Triton is imported only here, in the worker process, after its knobs are set
    import triton
    from triton.backends.compiler import GPUTarget  # lazy (as above)
    from triton.compiler import ASTSource  # lazy (as above)
    from triton.runtime.jit import JITFunction  # lazy (as above)

    from hatch_khal.errors import KhalBuildError  # lazy (as above)
    from hatch_khal.triton import kernelinfo  # lazy (as above)

    modules: dict[str, Any] = {}
    dotted = req.get("source_modules") or [None] * len(req["files"])
    for i, path in enumerate(req["files"]):
        sys.path.insert(0, os.path.dirname(path))
        try:
            modules[path] = _load(path, i, dotted[i])
        except Exception as exc:  # noqa: BLE001 - the author's module failed to import
            raise _Refused("SourceError", f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    files = {os.path.realpath(f) for f in req["files"]}
    out = []
    try:
        served = kernelinfo.import_modules(req.get("modules", []))
        modules.update(served)
        files |= {f for f in map(kernelinfo.module_file, served.values()) if f}
        for raw in req["instances"]:
            out.append(_instance(triton, ASTSource, GPUTarget, JITFunction, req, modules, files, raw))
    except KhalBuildError as exc:
        raise _Refused(type(exc).__name__, str(exc)) from None
    return {"ok": True, "triton": triton.__version__, "instances": out}


def _instance(triton: Any, ast_source: Any, gpu_target: Any, jit: type, req: dict[str, Any],
              modules: dict[str, Any], files: set[str], raw: dict[str, Any]) -> dict[str, Any]:
    """One instance (or lock variant) of the request, compiled for every target: the worker's answer
    for it (:mod:`hatch_khal.triton.worker`'s docstring)."""
    from hatch_khal.triton import kernelinfo  # lazy (as above)
    from hatch_khal.triton.instances import TritonInstance, fit, value_from_json, with_config  # lazy (as above)

    inst = TritonInstance.from_json(raw)
    key, obj = kernelinfo.find_kernel(modules, inst.kernel, lambda o: _unwrap(o, jit)[0], inst.where, inst.module,
                                      inst.recorded)
    fn, tuner, heuristics = _unwrap(obj, jit)
    assert fn is not None
    args = list(fn.arg_names)
    seen: dict[int, str] = {}
    _deps(fn, jit, seen)
    # a @triton.jit function the kernel calls, at any depth (Triton's cache_key covers its source):
    # its module's file is among what the compile read (hatch_khal.triton.audit), by the version of
    # the distribution that installed it or by content in the project; anything else is refused there
    params = kernelinfo.kernel_params(fn, inst.kernel)
    if inst.recorded:
        inst = fit(inst, params)
        _check_recorded_config(inst, tuner)
    _check_heuristics(inst, heuristics)
    configs = _configs(inst, tuner, args, params)
    variants = []
    for config in configs:
        variant = inst
        label = inst.where
        if config:
            variant = with_config(inst, args, config["index"],
                                  {k: value_from_json(v) for k, v in config["constexprs"].items()},
                                  config["num_warps"], config["num_stages"], config["num_ctas"], config["maxnreg"])
            label = f"instance {inst.name + ' (config ' + str(config['index']) + ')'!r}"
        variant = fit(variant, params)
        variants.append({**config, "targets": _compile_variant(triton, ast_source, gpu_target, req["targets"],
                                                               variant, fn, label)})
    root = req.get("served_root")
    entry: dict[str, Any] = {
        "name": inst.name, "cache_key": fn.cache_key, "arg_names": args, "deps": sorted(set(seen.values())),
        "params": [p.model_dump(mode="json") for p in params], "heuristics": heuristics,
        "source": req["files"].index(key) if key in req["files"] else None,
        "module": None if key in req["files"] else key,
        "served": sorted({os.path.relpath(os.path.realpath(f), root).replace(os.sep, "/") for f in seen.values()
                          if root and os.path.realpath(f).startswith(os.path.realpath(root) + os.sep)})}
    if inst.autotune:
        entry["configs"] = variants
        entry["autotune_key"] = [str(k) for k in tuner.keys]
    else:
        entry["targets"] = variants[0]["targets"]
        if inst.config is not None:
            entry["autotune_key"] = [str(k) for k in tuner.keys]
    return entry


def _unwrap(obj: Any, jit: type) -> tuple[Any, Any, list[str]]:
    """The @triton.jit function under ``obj``'s @triton.autotune / @triton.heuristics decorators (None
    when ``obj`` is none of them), the Autotuner (the outermost, or None) and the names of the
    constexprs every @triton.heuristics computes."""
    from triton.runtime.autotuner import Autotuner, Heuristics  # lazy (as above)

    tuner = None
    heuristics: list[str] = []
    for _ in range(16):
        if isinstance(obj, jit):
            return obj, tuner, heuristics
        if isinstance(obj, Autotuner):
            tuner = tuner or obj
        elif isinstance(obj, Heuristics):
            heuristics += [str(k) for k in obj.values]
        else:
            return None, None, []
        obj = obj.fn
    return None, None, []


def _configs(inst: Any, tuner: Any, args: list[str], params: list[Any]) -> list[dict[str, Any]]:
    """What to compile of an instance: itself (``[{}]``: its signature gives every argument), or with
    ``autotune``, one variant per ``triton.Config`` of the kernel's autotuner (its kwargs as
    constexprs, its num_warps / num_stages / num_ctas / maxnreg); each checked against the signature.
    A parameter with a default the signature may leave out (:func:`hatch_khal.triton.instances.fit`)."""
    from hatch_khal.triton import kernelinfo  # lazy (as above)
    from hatch_khal.triton.instances import value_json  # lazy (as above)

    name, kernel = inst.name, inst.kernel
    where = f"instance {name!r}"
    sig = [a.name for a in inst.args]
    defaulted = {p.name for p in params if p.has_default}
    if not inst.autotune:
        if not inst.recorded and ([a for a in args if a in sig] != sig or
                                  [a for a in args if a not in sig and a not in defaulted]):
            hint = ""
            if tuner is not None and set(sig) < set(args):
                given = sorted({k for c in tuner.configs for k in c.kwargs} - set(sig))
                hint = (f"; kernel {kernel!r} is @triton.autotune'd: give its configs' constexprs "
                        f"({', '.join(given)}) in the signature, or set autotune = true to build one variant per "
                        "config, chosen at run time")
            raise _Refused("ConfigError", f"{where}: the signature names {sig}, kernel {kernel!r} takes "
                           f"{args}{hint}")
        return [{}]
    if tuner is None:
        raise _Refused("ConfigError", f"{where}: option 'autotune' is true, but kernel {kernel!r} is not "
                       "decorated with @triton.autotune (it has no configs to build); drop the option")
    rule = inst.choose
    if rule is None:
        what = []
        if tuner.reset_to_zero:
            what.append(f"reset_to_zero={list(tuner.reset_to_zero)}")
        if tuner.restore_value:
            what.append(f"restore_value={list(tuner.restore_value)}")
        if tuner.user_defined_pre_hook or tuner.user_defined_post_hook:
            what.append("a pre_hook / post_hook")
        if tuner.early_config_prune is not None or tuner.perf_model is not None:
            what.append("prune_configs_by")
        if what:
            raise _Refused("ConfigError", f"{where}: kernel {kernel!r}'s @triton.autotune has {', '.join(what)}: "
                           "host code Triton runs around its benchmark, which khal's runtime (no Triton) cannot "
                           "run, so it cannot time the configs on the caller's buffers; give a rule instead: "
                           "choose = N (the index of the config to launch) or choose = \"first\"")
    for a in tuner.keys:
        if a not in args:
            raise _Refused("ConfigError", f"{where}: kernel {kernel!r}'s @triton.autotune key names {a!r}, which "
                           f"is not one of its arguments ({', '.join(args)})")
    out = []
    for j, c in enumerate(tuner.configs):
        here = f"{where}: config {j} of kernel {kernel!r}'s @triton.autotune ({c})"
        if c.pre_hook is not None:
            raise _Refused("ConfigError", f"{here} has a pre_hook, host code Triton runs before every launch of it, "
                           "which khal's runtime (no Triton) cannot run; drop the config's pre_hook (do its work "
                           "before the call) or build the kernel without autotune = true")
        if getattr(c, "ir_override", None) is not None:
            raise _Refused("ConfigError", f"{here} has an ir_override, which Triton crates do not build; drop it")
        kw = dict(c.kwargs)
        unknown = sorted(set(kw) - set(args))
        if unknown:
            raise _Refused("ConfigError", f"{here} sets {', '.join(unknown)}, which kernel {kernel!r} does not take")
        twice = sorted(set(kw) & set(sig))
        if twice:
            raise _Refused("ConfigError", f"{here} sets {', '.join(twice)}, which the instance's signature gives "
                           "too: leave them out of the signature (each config gives its own)")
        missing = [a for a in args if a not in sig and a not in kw and a not in defaulted]
        if missing or [a for a in args if a in sig] != sig:
            raise _Refused("ConfigError", f"{where}: the signature names {sig}; with config {j}'s "
                           f"{sorted(kw)} kernel {kernel!r} takes {args}: the signature lists the kernel's "
                           "arguments in order, less the constexprs every config sets")
        values = {k: value_json(kernelinfo.const_value(f"{here}: constexpr {k!r}", v)) for k, v in kw.items()}
        out.append({"index": j, "constexprs": values, "num_warps": int(c.num_warps), "num_stages": int(c.num_stages),
                    "num_ctas": int(c.num_ctas), "maxnreg": None if c.maxnreg is None else int(c.maxnreg)})
    if not out:
        raise _Refused("ConfigError", f"{where}: kernel {kernel!r}'s @triton.autotune has no configs")
    if isinstance(rule, int) and not 0 <= rule < len(out):
        raise _Refused("ConfigError", f"{where}: option 'choose' is {rule}, but kernel {kernel!r}'s "
                       f"@triton.autotune has {len(out)} config(s) (indexes 0 to {len(out) - 1})")
    return out


def _check_recorded_config(inst: Any, tuner: Any) -> None:
    """A lock variant that says which ``@triton.autotune`` config it ran (``config = N``) must still be
    that config: its kwargs among the variant's constexprs, its warps, stages, CTAs and maxnreg."""
    if inst.config is None:
        return
    from hatch_khal.triton import kernelinfo  # lazy (as above)

    def gone(detail: str) -> None:
        raise _Refused("ConfigError", f"{inst.where} no longer fits kernel {inst.kernel!r}: {detail}; record it "
                       "again (python -m hatch_khal triton record -- ...) or delete the variant from the lock file")

    if tuner is None:
        gone(f"it ran config {inst.config} of the kernel's @triton.autotune, and the kernel is not autotuned now")
    if inst.config >= len(tuner.configs):
        gone(f"it ran config {inst.config}, and the kernel's @triton.autotune has {len(tuner.configs)} config(s)")
    c = tuner.configs[inst.config]
    here = f"config {inst.config} of the kernel's @triton.autotune ({c})"
    mine = inst.constexprs()
    for k, v in c.kwargs.items():
        if k not in mine or mine[k] != kernelinfo.const_value(f"{here}: constexpr {k!r}", v):
            gone(f"{here} sets {k} = {v!r}, the variant {mine.get(k)!r}")
    given = (inst.num_warps, inst.num_stages, inst.num_ctas, inst.maxnreg)
    want = (int(c.num_warps), int(c.num_stages), int(c.num_ctas), None if c.maxnreg is None else int(c.maxnreg))
    if given != want:
        gone(f"{here} has num_warps, num_stages, num_ctas, maxnreg = {want}, the variant {given}")


def _check_heuristics(inst: Any, heuristics: list[str]) -> None:
    """A @triton.heuristics constexpr is computed from the arguments at each call, host code the
    runtime (no Triton) cannot run: the instance must give its value."""
    sig = inst.triton_signature()
    missing = [h for h in heuristics if h not in sig or sig[h] != "constexpr"]
    if missing:
        raise _Refused("ConfigError", f"{inst.where}: kernel {inst.kernel!r} computes "
                       f"{', '.join(missing)} from its arguments at each call (@triton.heuristics), host code "
                       "khal's runtime (no Triton) cannot run: give each a value in the instance's signature "
                       f"({missing[0]} = ...) and, where its value follows from an argument, build one instance "
                       "per value (the runtime refuses a call whose heuristic value is not the variant's)")


def compile_one(triton: Any, ast_source: Any, gpu_target: Any, fn: Any, signature: dict[str, str],
                constexprs: dict[str, Any], attrs: dict[Any, Any], capability: int, options: dict[str, Any]) -> Any:
    """Triton's compile of ``fn`` for ``sm_<capability>`` (Triton's ``CompiledKernel``: its
    ``asm["ttir"]`` is what :mod:`hatch_khal.triton.effects` reads)."""
    src = ast_source(fn, signature, constexprs, attrs)
    return triton.compile(src, target=gpu_target("cuda", capability, 32), options=options)


def _compile_variant(triton: Any, ast_source: Any, gpu_target: Any, targets_req: list[Any], inst: Any, fn: Any,
                     label: str) -> dict[str, Any]:
    """One variant (a :class:`~hatch_khal.triton.instances.TritonInstance` fitted to its kernel:
    every argument, in order) compiled for every target."""
    from hatch_khal.triton import kernelinfo  # lazy (as above)
    from hatch_khal.triton.effects import written_pointers  # lazy (as above)

    full = inst.triton_signature()
    names = list(full)
    constexprs = {k: kernelinfo.triton_value(v) for k, v in inst.compile_constexprs().items()}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in inst.divisible()}
    targets: dict[str, Any] = {}
    for target, capability, ptx_version in targets_req:
        options: dict[str, Any] = {"num_warps": inst.num_warps, "num_stages": inst.num_stages}
        if inst.num_ctas != 1:
            options["num_ctas"] = inst.num_ctas
        if inst.maxnreg is not None:
            options["maxnreg"] = inst.maxnreg
        if ptx_version is not None:
            options["ptx_version"] = ptx_version
        try:
            compiled = compile_one(triton, ast_source, gpu_target, fn, full, constexprs, attrs, capability, options)
        except Exception as exc:  # noqa: BLE001 - Triton's compile errors carry the source line
            raise _Refused("CompileError", f"{label} for {target}: {type(exc).__name__}: {exc}") from None
        md = compiled.metadata
        runtime = [a for a in names if full[a] != "constexpr"]
        found = written_pointers(compiled.asm.get("ttir", ""), md.name, len(runtime))
        targets[target] = {
            "written": None if found is None else [runtime[i] for i in sorted(found)
                                                   if str(full[runtime[i]]).startswith("*")],
            "ptx": compiled.asm["ptx"], "name": md.name, "shared": int(md.shared),
            "num_warps": int(md.num_warps), "num_ctas": int(md.num_ctas),
            "global_scratch_size": int(md.global_scratch_size),
            "global_scratch_align": int(getattr(md, "global_scratch_align", 1)),
            "profile_scratch_size": int(getattr(md, "profile_scratch_size", 0)),
            "profile_scratch_align": int(getattr(md, "profile_scratch_align", 1)),
            "launch_pdl": bool(getattr(md, "launch_pdl", False)),
            "launch_cooperative_grid": bool(getattr(md, "launch_cooperative_grid", False)),
            "ptxas": _ptxas_release(capability),
        }
    return targets


def _ptxas_release(capability: int) -> str | None:
    """The release of the ptxas this Triton used for ``capability`` (its PTX ISA is that ptxas'
    newest), as the build spells it (:func:`hatch_khal.triton.ptxas.tool_release`)."""
    from hatch_khal.triton.ptxas import tool_release  # lazy (as above)

    try:
        from triton.backends.nvidia.compiler import get_ptxas  # lazy (as above)

        path = str(get_ptxas(capability).path)
    except Exception:  # noqa: BLE001 - another Triton layout: the build resolves ptxas itself
        return None
    return tool_release(path)


def _prepare_audit(req: dict[str, Any]) -> Audit:
    """The audit hook, installed with Triton and the worker's own modules already imported (they are
    covered by Triton's and hatch-khal's versions), not yet armed."""
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    # lazy: Triton is imported only here, in the worker process, after its knobs are set
    import triton  # noqa: F401
    import triton.backends.compiler  # noqa: F401 - lazy (as above)
    import triton.compiler  # noqa: F401 - lazy (as above)
    import triton.runtime.autotuner  # noqa: F401 - lazy (as above)
    import triton.runtime.jit  # noqa: F401 - lazy (as above)

    import hatch_khal.triton.effects  # noqa: F401 - lazy (as above)
    import hatch_khal.triton.ptxas  # noqa: F401 - lazy (as above)

    scratch = req.get("scratch")
    audit = Audit(ignored=(os.path.realpath(scratch), os.path.abspath(scratch)) if scratch else ())
    audit.install()
    return audit


def _tool_dirs() -> list[str]:
    """hatch-khal's own packages (the build tool: its version is in every key)."""
    import hatch_khal  # lazy (as above)
    import khal_runtime  # lazy (as above)

    return [os.path.realpath(os.path.dirname(m.__file__ or "")) for m in (hatch_khal, khal_runtime)]


def main() -> None:
    req = json.loads(sys.stdin.read())
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # the author's modules may print: only the answer goes to stdout
    audit = _prepare_audit(req)
    before = set(sys.modules)
    try:
        audit.arm()
        try:
            answer = _compile(req)
        finally:
            audit.disarm()
        answer["reads"] = audit.facts(req.get("root") or os.getcwd(), list(req.get("crate_files", req["files"])),
                                      _tool_dirs(), before)
    except _Refused as exc:
        answer = {"ok": False, "kind": exc.kind, "message": str(exc)}
    real_stdout.write(json.dumps(answer))
    real_stdout.flush()


if __name__ == "__main__":
    main()
