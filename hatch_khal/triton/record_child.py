"""The recorder inside the command ``python -m hatch_khal triton record`` runs (every Python
process it starts): it sees each launch of the crates' Triton kernels and writes the variants
Triton's JIT compiled for them, and the launches of each, to a folder the parent reads.

This file is copied next to a ``sitecustomize.py`` into a folder put first on the child's
``PYTHONPATH`` (:mod:`hatch_khal.triton.record`): it imports nothing of hatch_khal (the command may
run another Python, where hatch_khal is not installed) and nothing at all until Triton is imported
(:class:`_Finder`), so a process that never imports Triton pays nothing.

Where the variants come from:

* **Triton's JIT** (a GPU): ``triton.knobs.runtime.jit_cache_hook`` (any hook set before is
  chained, and re-chained if the program replaces ours), called before each compile with what is
  compiled: the signature, the constexprs (the JIT's ``1`` and ``None`` among them), the
  ``tt.divisibility`` attributes, the options. ``JITFunction.run`` is wrapped (in this process only:
  a recording tool) to count each launch against the variant its compiled kernel is.
* **Triton's interpreter** (``TRITON_INTERPRET=1``, no GPU): the interpreter compiles nothing, so
  ``InterpretedFunction.run`` is wrapped and the specialisation is computed as the JIT would with
  Triton's own binder (``create_function_from_signature`` over ``native_specialize_impl``) and the
  NVIDIA backend's rules and default options (a ``GPUTarget("cuda", 90, 32)``; no GPU is needed).
* Under ``@triton.autotune``, ``Autotuner.run`` is wrapped to know which autotuner launches the
  kernel; the variant's ``config`` is the index of the autotuner's config whose keyword arguments
  and options the launch was given.

Nothing here may break the program: a failure is written as a problem for the parent to report.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
import threading
from typing import Any, Optional, Sequence

#: the variable naming the recording's configuration file (set by the parent for its command)
ENV = "KHAL_TRITON_RECORDING"
#: the NVIDIA target whose rules the interpreter's launches are specialised with
INTERPRET_TARGET = ("cuda", 90, 32)
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


class Unsupported(Exception):
    """A launch the lock file cannot hold (a tuple argument, a constexpr of another type)."""


def _const(name: str, value: Any) -> Any:
    """A constexpr's value as the lock file spells it (JSON)."""
    while type(value).__name__ == "constexpr" and hasattr(value, "value"):  # tl.constexpr(...)
        value = value.value
    if value is None:
        return {"none": True}
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise Unsupported(f"constexpr {name} = {value} does not fit a 64-bit integer")
        return value
    if isinstance(value, float):
        return value  # inf and nan too: Python's json writes and reads them (Infinity, NaN)
    cls = type(value)
    if any(c.__name__ == "dtype" and c.__module__.startswith("triton") for c in cls.__mro__) and hasattr(value, "name"):
        return {"dtype": str(value.name)}
    raise Unsupported(f"constexpr {name} is a {cls.__module__}.{cls.__qualname__}, which a lock file cannot hold "
                      "(ints, floats, bools, strings, tl.dtypes and None)")


def _divisible(attrs: Any) -> bool:
    return any(list(a)[:1] == ["tt.divisibility"] and list(a)[1:] == [16] for a in attrs or ())


def translate(params: Sequence[Any], signature: dict[str, Any], constants: dict[Any, Any], attrs: dict[Any, Any],
              options: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """(args, constexprs, options) in the lock file's spellings, from what Triton's ``_pack_args``
    makes of a launch (``signature``: name -> type or "constexpr"; ``constants`` and ``attrs``
    keyed by argument path; ``options``: the backend's options as a dict)."""
    args: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for i, p in enumerate(params):
        ty = signature[p.name]
        if not isinstance(ty, str):
            raise Unsupported(f"argument {p.name} is a tuple ({ty!r}); khal's Triton crates take no tuple arguments")
        if p.is_constexpr:
            constexprs[p.name] = _const(p.name, constants.get((i,)))
        elif ty == "constexpr":  # the JIT compiled an argument in: None, or an integer equal to 1
            value = constants.get((i,))
            if value is None:
                args[p.name] = "none"
            elif type(value) is int and value == 1:
                args[p.name] = "i32:1"
            else:
                raise Unsupported(f"argument {p.name} was compiled in as {value!r}")
        else:
            args[p.name] = ty + (":16" if _divisible(attrs.get((i,))) else "")
    out: dict[str, Any] = {"num_warps": int(options["num_warps"]), "num_stages": int(options["num_stages"])}
    if int(options.get("num_ctas") or 1) != 1:
        out["num_ctas"] = int(options["num_ctas"])
    if options.get("maxnreg") is not None:
        out["maxnreg"] = int(options["maxnreg"])
    return args, constexprs, out


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Recorder:
    """One per process: which kernels are the crates', the variants seen, the launches counted."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.out_dir: str = config["out"]
        #: realpath -> crate; sha256 of a source's bytes -> crate (an installed copy of a crate's file)
        self.files: dict[str, str] = {}
        self.digests: dict[str, str] = {}
        self.modules: dict[str, str] = {}
        for crate in config["crates"]:
            for f in crate.get("files", ()):
                self.files[os.path.realpath(f["path"])] = crate["name"]
                self.digests[f["sha256"]] = crate["name"]
            for m in crate.get("modules", ()):
                self.modules[m] = crate["name"]
        self.lock = threading.RLock()
        self.local = threading.local()
        self.launches: dict[str, int] = {}  # canonical JSON -> this process's id of the variant
        self.others: dict[tuple[str, str, str], int] = {}
        self.problems: set[str] = set()
        self._crate_of: dict[int, tuple[Any, Optional[tuple[str, Optional[str]]]]] = {}
        self._file_digest: dict[str, Optional[str]] = {}
        self._compiled: dict[int, tuple[Any, str]] = {}  # id(CompiledKernel) -> (kernel, canonical)
        self._interp_binders: dict[int, tuple[Any, Any]] = {}
        self._out: Any = None
        self._pid = -1
        self._emit({"started": os.getpid(), "python": sys.executable})

    # -- output: one line per event, written at once (a process ended by os._exit, as forked
    # -- multiprocessing workers are, or killed, loses nothing it launched before) -----------

    def _emit(self, obj: dict[str, Any]) -> None:
        with self.lock:
            try:
                if self._pid != os.getpid():
                    self._out = open(os.path.join(self.out_dir, f"{os.getpid()}.jsonl"), "a", encoding="utf-8",
                                     buffering=1)
                    self._pid = os.getpid()
                self._out.write(json.dumps(obj, ensure_ascii=False) + "\n")
            except (OSError, ValueError):
                pass  # the parent's folder is gone: nothing to report to

    def after_fork(self) -> None:
        """A forked child writes its own file: it declares again what it launches."""
        self.lock = threading.RLock()
        self.local = threading.local()
        self.launches.clear()
        self.others.clear()
        self.problems.clear()
        self._emit({"started": os.getpid(), "python": sys.executable})

    def problem(self, text: str) -> None:
        with self.lock:
            if text in self.problems:
                return
            self.problems.add(text)
        self._emit({"problem": text})

    # -- which crate ----------------------------------------------------------------------

    def _digest(self, path: str) -> Optional[str]:
        if path not in self._file_digest:
            try:
                with open(path, "rb") as f:
                    self._file_digest[path] = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                self._file_digest[path] = None
        return self._file_digest[path]

    def crate_of(self, kernel: Any) -> Optional[tuple[str, Optional[str]]]:
        """(crate, module for a module crate or None) of a JITFunction / InterpretedFunction, or
        None when it is no crate's; counted among the others then."""
        hit = self._crate_of.get(id(kernel))
        if hit is not None and hit[0] is kernel:
            return hit[1]
        fn = getattr(kernel, "fn", None)
        module = getattr(fn, "__module__", None) or ""
        code = getattr(fn, "__code__", None)
        path = os.path.realpath(code.co_filename) if code is not None else ""
        found: Optional[tuple[str, Optional[str]]] = None
        if module in self.modules:
            found = (self.modules[module], module)
        elif path in self.files:
            found = (self.files[path], None)
        elif path and self.digests:
            digest = self._digest(path)
            if digest in self.digests:
                found = (self.digests[digest], None)
        self._crate_of[id(kernel)] = (kernel, found)
        return found

    def other(self, kernel: Any, warmup: bool) -> None:
        if warmup:
            return
        fn = getattr(kernel, "fn", None)
        code = getattr(fn, "__code__", None)
        key = (str(getattr(fn, "__module__", "")), str(getattr(fn, "__qualname__", "")),
               code.co_filename if code is not None else "")
        with self.lock:
            n = self.others.get(key)
            if n is None:
                n = self.others[key] = len(self.others)
                self._emit({"other_id": n, "other": list(key)})
            self._emit({"o": n})

    # -- variants -------------------------------------------------------------------------

    def variant(self, kernel: Any, params: Sequence[Any], signature: dict[str, Any], constants: dict[Any, Any],
                attrs: dict[Any, Any], options: dict[str, Any]) -> Optional[str]:
        """Record the variant (once) and answer its canonical JSON; None (a problem noted) if the
        lock file cannot hold it."""
        where = self.crate_of(kernel)
        if where is None:
            return None
        crate, module = where
        name = str(kernel.fn.__qualname__)
        try:
            args, constexprs, opts = translate(params, signature, constants, attrs, options)
        except Unsupported as exc:
            self.problem(f"{crate}.{name}: a launch was not recorded: {exc}")
            return None
        v: dict[str, Any] = {"crate": crate, "kernel": name}
        if module is not None:
            v["module"] = module
        v.update(args=args, constexprs=constexprs, **opts)
        kwargs = getattr(self.local, "kwargs", None) or {}
        tuner = next((t for t in reversed(getattr(self.local, "tuners", None) or ()) if _wraps(t, kernel)), None)
        if tuner is not None:
            config = _config_index(tuner, kwargs)
            if config is None:
                self.problem(f"{crate}.{name}: a launch under @triton.autotune with options or constexprs of no "
                             "config in its list (prune_configs_by?) was recorded without a config index")
            else:
                v["config"] = config
        for k in kwargs:
            if k not in _OPTIONS and k not in {p.name for p in params}:
                self.problem(f"{crate}.{name}: launch option {k}={kwargs[k]!r} is not in the lock file (the build "
                             "compiles with Triton's default for it)")
        canon = _canonical(v)
        with self.lock:
            if canon not in self.launches:
                self.launches[canon] = len(self.launches)
                self._emit({"id": self.launches[canon], "variant": v})
        return canon

    def count(self, canon: Optional[str]) -> None:
        if canon is not None:
            self._emit({"l": self.launches[canon]})

    # -- the JIT --------------------------------------------------------------------------

    def jit_hook(self, compile: dict[str, Any], fn: Any) -> None:
        """What ``jit_cache_hook`` sees of a compile: the variant, for the launch in progress."""
        jit = getattr(fn, "jit_function", None)
        if jit is None or self.crate_of(jit) is None:
            return
        try:
            options = json.loads(compile["specialization_data"])["options"]
        except (KeyError, TypeError, ValueError):
            options = {k: compile.get(k) for k in ("num_warps", "num_stages", "num_ctas")}
        configs = compile.get("configs") or [{}]
        attrs = {tuple(k): v for k, v in configs[0].items()}
        constants = {tuple(k): v for k, v in compile["constants"].items()}
        canon = self.variant(jit, jit.params, compile["signature"], constants, attrs, options)
        self.local.pending = canon

    def jit_run(self, orig: Any, jit: Any, args: tuple[Any, ...], grid: Any, warmup: bool,
                kwargs: dict[str, Any]) -> Any:
        if self.crate_of(jit) is None:
            self.other(jit, warmup)
            return orig(jit, *args, grid=grid, warmup=warmup, **kwargs)
        self.local.kwargs = dict(kwargs)
        self.local.pending = None
        try:
            kernel = orig(jit, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            self.local.kwargs = None
        canon = self.local.pending
        self.local.pending = None
        if kernel is None:
            return kernel
        with self.lock:
            if canon is not None:
                self._compiled[id(kernel)] = (kernel, canon)
            else:
                known = self._compiled.get(id(kernel))
                canon = known[1] if known is not None and known[0] is kernel else None
        if not warmup:
            self.count(canon)
        return kernel

    # -- the interpreter ------------------------------------------------------------------

    def interpret_run(self, orig: Any, fn: Any, args: tuple[Any, ...], grid: Any, warmup: bool,
                      kwargs: dict[str, Any]) -> Any:
        if self.crate_of(fn) is None:
            self.other(fn, warmup)
            return orig(fn, *args, grid=grid, warmup=warmup, **kwargs)
        canon = None
        try:
            params, backend, binder = self._binder(fn)
            bound, specialization, options = binder(*args, **kwargs)
            from triton.runtime.jit import JITFunction  # lazy: Triton is imported when this runs

            holder = _Params(params)
            opts, signature, constants, attrs = JITFunction._pack_args(holder, backend, kwargs, bound,
                                                                       specialization, options)
            self.local.kwargs = dict(kwargs)
            try:
                canon = self.variant(fn, params, signature, constants, attrs, dict(opts.__dict__))
            finally:
                self.local.kwargs = None
        except Exception as exc:  # never the program's failure: it runs as it would have
            self.problem(f"{fn.fn.__qualname__}: the interpreter's launch could not be specialised "
                         f"({type(exc).__name__}: {exc})")
        result = orig(fn, *args, grid=grid, warmup=warmup, **kwargs)
        if not warmup:
            self.count(canon)
        return result

    def _binder(self, fn: Any) -> tuple[Any, Any, Any]:
        hit = self._interp_binders.get(id(fn))
        if hit is not None and hit[0] is fn:
            return hit[1]  # type: ignore[no-any-return]
        # lazy: Triton is imported when this runs
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.jit import KernelParam, create_function_from_signature

        sig = inspect.signature(fn.fn)
        dns = list(fn.kwargs.get("do_not_specialize") or ())
        dnsoa = list(fn.kwargs.get("do_not_specialize_on_alignment") or ())
        params = [KernelParam(i, p, i in dns or p.name in dns, i in dnsoa or p.name in dnsoa)
                  for i, p in enumerate(sig.parameters.values())]
        backend = make_backend(GPUTarget(*INTERPRET_TARGET))
        made = (params, backend, create_function_from_signature(sig, params, backend))
        self._interp_binders[id(fn)] = (fn, made)
        return made


class _Params:
    """What Triton's ``JITFunction._pack_args`` reads of its ``self``: the kernel's parameters."""

    def __init__(self, params: list[Any]) -> None:
        self.params = params


def _wraps(tuner: Any, kernel: Any) -> bool:
    """Whether the autotuner launches ``kernel`` (through any ``@triton.heuristics`` between)."""
    f = getattr(tuner, "fn", None)
    for _ in range(16):
        if f is None:
            return False
        if f is kernel:
            return True
        f = getattr(f, "fn", None)
    return False


def _config_index(tuner: Any, kwargs: dict[str, Any]) -> Optional[int]:
    for i, cfg in enumerate(getattr(tuner, "configs", None) or ()):
        try:
            wanted = cfg.all_kwargs()
        except Exception:
            continue
        if all(k in kwargs and kwargs[k] == v for k, v in wanted.items()):
            return i
    return None


# ---------------------------------------------------------------------------------------------
# patching Triton when it is imported

RECORDER: Optional[Recorder] = None


def _make_hook(rec: Recorder, previous: Any) -> Any:
    def khal_record_jit_cache_hook(*args: Any, **kwargs: Any) -> Any:
        try:
            rec.jit_hook(kwargs.get("compile") or {}, kwargs.get("fn"))
        except Exception as exc:  # never the program's failure
            rec.problem(f"the JIT's compile hook failed: {type(exc).__name__}: {exc}")
        return previous(*args, **kwargs) if previous is not None else None

    khal_record_jit_cache_hook.khal_previous = previous  # type: ignore[attr-defined]
    return khal_record_jit_cache_hook


def _ensure_hook(rec: Recorder, knobs: Any) -> None:
    """Our hook on ``knobs.runtime.jit_cache_hook``, chaining whatever the program set there."""
    current = knobs.runtime.jit_cache_hook
    if getattr(current, "__name__", "") != "khal_record_jit_cache_hook":
        knobs.runtime.jit_cache_hook = _make_hook(rec, current)


def patch_triton(rec: Recorder) -> None:
    """Wrap ``JITFunction.run``, ``Autotuner.run`` and install the compile hook (Triton is imported)."""
    from triton import knobs  # lazy: Triton was just imported by the program
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    _ensure_hook(rec, knobs)
    if not getattr(JITFunction.run, "khal_recording", False):
        orig_jit = JITFunction.run

        def run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
            _ensure_hook(rec, knobs)  # the program may have set its own hook since
            return rec.jit_run(orig_jit, self, args, grid, warmup, kwargs)

        run.khal_recording = True  # type: ignore[attr-defined]
        JITFunction.run = run
    if not getattr(Autotuner.run, "khal_recording", False):
        orig_tune = Autotuner.run

        def tune(self: Any, *args: Any, **kwargs: Any) -> Any:
            stack = getattr(rec.local, "tuners", None)
            if stack is None:
                stack = rec.local.tuners = []
            stack.append(self)
            try:
                return orig_tune(self, *args, **kwargs)
            finally:
                stack.pop()

        tune.khal_recording = True  # type: ignore[attr-defined]
        Autotuner.run = tune
    if "triton.runtime.interpreter" in sys.modules:
        patch_interpreter(rec)


def patch_interpreter(rec: Recorder) -> None:
    from triton.runtime.interpreter import InterpretedFunction  # lazy: imported by the program just now

    if getattr(InterpretedFunction.run, "khal_recording", False):
        return
    orig = InterpretedFunction.run

    def run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        return rec.interpret_run(orig, self, args, grid, warmup, kwargs)

    run.khal_recording = True  # type: ignore[attr-defined]
    InterpretedFunction.run = run


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, after: Any) -> None:
        self.inner = inner
        self.after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.after()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code ...
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches Triton right after ``triton`` (and ``triton.runtime.interpreter``) is imported."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == "triton":
            after = self._triton
        elif fullname == "triton.runtime.interpreter":
            after = self._interpreter
        else:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, after)
        return spec

    def _triton(self) -> None:
        try:
            patch_triton(self.rec)
        except Exception as exc:  # never the program's failure
            self.rec.problem(f"Triton could not be patched for recording: {type(exc).__name__}: {exc}")

    def _interpreter(self) -> None:
        try:
            patch_interpreter(self.rec)
        except Exception as exc:  # never the program's failure
            self.rec.problem(f"Triton's interpreter could not be patched for recording: {type(exc).__name__}: {exc}")


def install() -> None:
    """Start recording in this process (from the bootstrap ``sitecustomize``)."""
    global RECORDER
    path = os.environ.get(ENV)
    if not path or RECORDER is not None:
        return
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    rec = RECORDER = Recorder(config)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=rec.after_fork)
    if "triton" in sys.modules:
        patch_triton(rec)
    else:
        sys.meta_path.insert(0, _Finder(rec))
