"""The Triton stage's worker: ``python -m hatch_khal.triton.worker`` imports a crate's ``.py``
sources with Triton and compiles every instance for every target, in a process of its own (the
crate's modules are the author's code: they are never imported into the hook's process).

It reads one JSON request on stdin and writes one JSON answer on stdout:

* request: ``{"files": [abs path, ...], "instances": [{"name", "kernel", "signature",
  "constexprs", "divisible", "num_warps", "num_stages"}], "targets": [[target, capability,
  ptx_version or null], ...]}``
* answer: ``{"ok": true, "triton": version, "instances": [{"name", "cache_key", "deps": [file...],
  "arg_names", "targets": {target: {"ptx", "name", "shared", "num_warps", "num_ctas",
  "global_scratch_size", "profile_scratch_size", "launch_pdl", "launch_cooperative_grid"}}}]}``,
  or ``{"ok": false, "kind": error class name, "message": ...}``.

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
from typing import Any


class _Refused(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _load(path: str, index: int) -> Any:
    name = f"_khal_triton_src_{index}_{os.path.splitext(os.path.basename(path))[0]}"
    spec = importlib.util.spec_from_file_location(name, path)
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

    before = set(sys.modules)
    modules: dict[str, Any] = {}
    for i, path in enumerate(req["files"]):
        sys.path.insert(0, os.path.dirname(path))
        try:
            modules[path] = _load(path, i)
        except Exception as exc:  # noqa: BLE001 - the author's module failed to import
            raise _Refused("SourceError", f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    files = {os.path.realpath(f) for f in req["files"]}
    out = []
    for inst in req["instances"]:
        found = [(path, m.__dict__[inst["kernel"]]) for path, m in modules.items()
                 if isinstance(m.__dict__.get(inst["kernel"]), JITFunction)
                 and m.__dict__[inst["kernel"]].fn.__module__ == m.__name__]
        if len(found) != 1:
            where = ", ".join(p for p, _ in found) if found else "none of the crate's sources"
            raise _Refused("ConfigError", f"instance {inst['name']!r}: option 'kernel' names {inst['kernel']!r}, a "
                           f"@triton.jit function that {where} define{'s' if len(found) == 1 else ''}: it must be "
                           "defined in exactly one source of the crate")
        fn = found[0][1]
        args = list(fn.arg_names)
        seen: dict[int, str] = {}
        _deps(fn, JITFunction, seen)
        # Triton's own (tl.sum, ...) are covered by its version
        own = os.path.realpath(os.path.dirname(triton.__file__)) + os.sep
        outside = sorted({f for f in seen.values()
                          if os.path.realpath(f) not in files and not os.path.realpath(f).startswith(own)})
        if outside:
            raise _Refused("SourceError", f"instance {inst['name']!r}: kernel {inst['kernel']!r} calls @triton.jit "
                           f"functions defined outside the crate's sources ({', '.join(outside)}): the entry hash "
                           "could not cover them; add their files to the crate's 'sources'")
        sig = inst["signature"]
        if list(sig) != args:
            raise _Refused("ConfigError", f"instance {inst['name']!r}: the signature names {list(sig)}, kernel "
                           f"{inst['kernel']!r} takes {args}")
        constexprs = dict(inst["constexprs"])
        attrs = {(args.index(a),): [["tt.divisibility", 16]] for a in inst["divisible"]}
        targets: dict[str, Any] = {}
        for target, capability, ptx_version in req["targets"]:
            options: dict[str, Any] = {"num_warps": inst["num_warps"], "num_stages": inst["num_stages"]}
            if ptx_version is not None:
                options["ptx_version"] = ptx_version
            src = ASTSource(fn, sig, constexprs, attrs)
            try:
                compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
            except Exception as exc:  # noqa: BLE001 - Triton's compile errors carry the source line
                raise _Refused("CompileError", f"instance {inst['name']!r} for {target}: {type(exc).__name__}: "
                               f"{exc}") from None
            md = compiled.metadata
            targets[target] = {
                "ptx": compiled.asm["ptx"], "name": md.name, "shared": int(md.shared),
                "num_warps": int(md.num_warps), "num_ctas": int(md.num_ctas),
                "global_scratch_size": int(md.global_scratch_size),
                "profile_scratch_size": int(getattr(md, "profile_scratch_size", 0)),
                "launch_pdl": bool(getattr(md, "launch_pdl", False)),
                "launch_cooperative_grid": bool(getattr(md, "launch_cooperative_grid", False)),
                "ptxas": _ptxas_release(capability),
            }
        out.append({"name": inst["name"], "cache_key": fn.cache_key, "arg_names": args,
                    "deps": sorted(set(seen.values())), "targets": targets})
    return {"ok": True, "triton": triton.__version__, "instances": out,
            "imported": _imported(set(sys.modules) - before, files)}


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


def _imported(names: set[str], crate_files: set[str]) -> list[list[str]]:
    """[path, sha256] of every module file the crate's sources imported that is neither one of
    them nor installed (under the interpreter's or a site-packages folder): the project's own
    modules beside the crate, whose constants a kernel may read. A cached build whose files
    changed is compiled again."""
    import hashlib  # lazy: the worker's last step
    import sysconfig  # lazy: the worker's last step

    roots = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                   *sysconfig.get_paths().values()) if p}
    roots |= {os.path.realpath(p) + os.sep for p in sys.path if p and "-packages" in p}
    out = []
    for name in sorted(names):
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path or name.startswith("_khal_triton_src_"):
            continue
        real = os.path.realpath(path)
        if real in crate_files or any(real.startswith(r) for r in roots) or not os.path.isfile(real):
            continue
        with open(real, "rb") as f:
            out.append([real, hashlib.sha256(f.read()).hexdigest()])
    return out


def main() -> None:
    req = json.loads(sys.stdin.read())
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # the author's modules may print: only the answer goes to stdout
    try:
        answer = _compile(req)
    except _Refused as exc:
        answer = {"ok": False, "kind": exc.kind, "message": str(exc)}
    real_stdout.write(json.dumps(answer))
    real_stdout.flush()


if __name__ == "__main__":
    main()
