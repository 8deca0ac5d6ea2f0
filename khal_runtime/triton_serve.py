"""Host code as written: the modules whose Triton kernels a loaded package serves (#36, items 4-5).

A Triton entry whose manifest names where its kernel is importable (``TritonFacts.module`` and
``qualname``: a module of the wheel's own package, or, for a companion crate
(``Crate.triton.serves``), a module of the library it serves) is *served*: once that module has
executed, each of its globals holding the kernel (Triton's ``JITFunction`` / ``Autotuner`` /
``Heuristics``, or the stand-in's) is replaced by the crate's ``TritonFunction`` for
``(module, qualname)``, after ``adopt_host(original)`` (it keeps the original for its heuristics and
the JIT fallback). Host code that launches ``kernel[grid](...)`` from those globals then runs the
wheel's kernels unchanged. Triton's own modules are never touched: only the served modules' globals
change.

How: :func:`serve` (called by ``khal_runtime.load``) registers the crate's ``(module, qualname)``
pairs and puts one meta-path finder first in ``sys.meta_path``. When a served module is imported,
the finder finds its spec as the other finders would and wraps its loader, so that the globals are
replaced right after the module executes (the module's ``__loader__`` / ``__spec__.loader`` are the
original loader again by then). A served module already imported at ``load()`` is patched then,
with any other module of its top-level package holding the same kernel object.

Without Triton installed, the served modules, their parent packages, and the modules of their
top-level package imported while one of those executes, see khal's stand-in
(:mod:`khal_runtime.triton_standin`) for ``import triton`` / ``triton.language`` / ...: the stand-in
modules are in ``sys.modules`` only while such a module executes. A module of another package
imported meanwhile (torch, say) executes with them taken out again, and when the outermost served
import ends they are gone: ``importlib.util.find_spec("triton")`` still says there is no Triton, and
torch's ``has_triton()`` stays False. With Triton installed the stand-in is never used.

A companion crate serves only the library version it was built for
(:func:`khal_runtime.triton_companion.check_companion`, before anything of it is registered).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import types
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol, Sequence, cast

from khal_runtime import triton_standin
from khal_runtime.triton_companion import check_companion

if TYPE_CHECKING:
    from khal_runtime.manifest import Crate
    from khal_runtime.kernels import CrateKernels, KernelSet

__all__ = ["serve", "served_modules"]


class _FunctionSource(Protocol):
    """What serving reads of a crate's kernels (notes/triton-jit.md, "Interfaces between the run-time
    helpers"): ``CrateKernels.triton_functions()``, the crate's ``TritonFunction`` by (module, qualname)."""

    def triton_functions(self) -> Mapping[tuple[str, str], Any]: ...


@dataclass(frozen=True)
class _Owner:
    """A loaded crate serving kernels: its package, its name, its kernels (for their functions)."""

    package: str
    crate: str
    kernels: Any

    def function(self, module: str, qualname: str) -> Any:
        """The crate's ``TritonFunction`` for the kernel (made on first use by the crate)."""
        return cast(_FunctionSource, self.kernels).triton_functions()[(module, qualname)]


_lock = threading.RLock()
#: (module, qualname) -> the crate serving that kernel
_served: dict[tuple[str, str], _Owner] = {}
#: served module -> the qualnames served there
_by_module: dict[str, set[str]] = {}
#: served modules and their parent packages (a stand-in scope opens when one executes)
_scoped: set[str] = set()
#: top-level packages of the served modules
_packages: set[str] = set()
#: whether real Triton is importable (None: not asked yet)
_real_triton: Optional[bool] = None
#: per executing import of the stand-in's scope, innermost last: whether the stand-in is visible
#: while it executes (a module of a served package: True; of another package: False)
_visible: list[bool] = []


# --- the finder -------------------------------------------------------------------------------------

def _is_triton(name: str) -> bool:
    return name == "triton" or name.startswith("triton.")


def _top(name: str) -> str:
    return name.partition(".")[0]


class _Finder:
    """First in ``sys.meta_path`` once a package serves modules: wraps the loaders of served modules
    (and, while the stand-in is in use, of every module imported inside a served import); answers
    ``triton`` / ``triton.*`` with the stand-in while a module of a served package executes and
    Triton is not installed."""

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if _is_triton(name):
            return triton_standin.spec(name) if _visible and _visible[-1] else None
        served = name in _by_module
        if not served and name not in _scoped and not _visible:
            return None
        spec = self._find_elsewhere(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module") \
                or isinstance(spec.loader, _Loader) or spec.origin in (None, "built-in", "frozen"):
            return spec  # nothing to wrap: no loader, a namespace package, a module of the interpreter
        standin = not _triton_installed()
        if _visible:  # inside a served import, the stand-in in use: every module is scoped
            scope: Optional[bool] = _top(name) in _packages
        elif name in _scoped and standin:
            scope = True
        else:
            scope = None
        if not served and scope is None:
            return spec
        spec.loader = _Loader(spec.loader, name, served, scope)  # type: ignore[assignment]
        return spec

    def _find_elsewhere(self, name: str, path: Optional[Sequence[str]],
                        target: Optional[types.ModuleType]) -> Optional[importlib.machinery.ModuleSpec]:
        """The spec the finders after this one give (as if it were not there)."""
        finders = list(sys.meta_path)
        start = next((i + 1 for i, f in enumerate(finders) if f is self), 0)
        for finder in finders[start:]:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                return spec  # type: ignore[no-any-return]
        return None

    def invalidate_caches(self) -> None:
        pass


class _Loader:
    """A module's own loader, wrapped: ``scope`` True / False: the stand-in is visible / hidden while
    the module executes (None: as it was); ``served``: replace its kernels after it executed."""

    def __init__(self, inner: Any, name: str, served: bool, scope: Optional[bool]) -> None:
        self.inner = inner
        self.name = name
        self.served = served
        self.scope = scope

    def __getattr__(self, attr: str) -> Any:  # get_source, get_filename, is_package, resource readers
        return getattr(self.inner, attr)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        create = getattr(self.inner, "create_module", None)
        if create is None:
            return None
        with _Scope(self.scope):  # an extension module's code runs here
            return create(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        # the module keeps its own loader (inspect, importlib.resources, reload see nothing of this one)
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.inner
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.inner
        with _Scope(self.scope):
            self.inner.exec_module(module)
        if self.served:
            _patch(module)


class _Scope:
    """Makes the stand-in visible (True) or hidden (False) in ``sys.modules`` while a module
    executes, and as it was after; None: nothing changes."""

    __slots__ = ("visible",)

    def __init__(self, visible: Optional[bool]) -> None:
        self.visible = visible

    def __enter__(self) -> None:
        if self.visible is not None:
            _visible.append(self.visible)
            _show(self.visible)

    def __exit__(self, *exc: Any) -> None:
        if self.visible is not None:
            _visible.pop()
            _show(bool(_visible) and _visible[-1])


def _show(visible: bool) -> None:
    """Put the stand-in modules made so far into ``sys.modules``, or take them out."""
    for name, mod in triton_standin.made().items():
        if visible:
            if name not in sys.modules:  # (a None there blocks the import on purpose: kept)
                sys.modules[name] = mod
        elif sys.modules.get(name) is mod:
            del sys.modules[name]


def _triton_installed() -> bool:
    """Whether real Triton is importable in this process (asked once)."""
    global _real_triton
    if _real_triton is None:
        mod = sys.modules.get("triton")
        if mod is not None:
            _real_triton = not triton_standin.is_module(mod)
        else:
            try:
                spec = importlib.util.find_spec("triton")
            except (ImportError, ValueError):
                spec = None
            _real_triton = spec is not None and spec.loader is not triton_standin.spec("triton").loader
    return _real_triton


# --- replacing the kernels --------------------------------------------------------------------------

def _is_kernel(obj: Any) -> bool:
    """A Triton kernel object: the stand-in's, or real Triton's ``KernelInterface`` (JITFunction,
    Autotuner, Heuristics) when Triton is imported."""
    if triton_standin.is_kernel(obj):
        return True
    jit = sys.modules.get("triton.runtime.jit")
    base = getattr(jit, "KernelInterface", None) if jit is not None and not triton_standin.is_module(jit) else None
    return isinstance(base, type) and isinstance(obj, base)


def _is_served_function(obj: Any) -> bool:
    """A ``TritonFunction`` put there by an earlier load (duck-typed: this layer does not import it)."""
    return callable(getattr(obj, "adopt_host", None)) and hasattr(obj, "host")


def _holder(module: types.ModuleType, qualname: str) -> tuple[Any, str] | None:
    """The object holding ``qualname``'s last part (the module, or a class in it), or None."""
    parts = qualname.split(".")
    if "<locals>" in parts:
        return None
    obj: Any = module
    for p in parts[:-1]:
        obj = getattr(obj, p, None)
        if obj is None:
            return None
    return obj, parts[-1]


def _identity(obj: Any) -> tuple[Any, Any]:
    """(module, qualname) of the Python function under a kernel object's decorators (``.fn`` down)."""
    for _ in range(16):
        inner = getattr(obj, "fn", None)
        if inner is None:
            break
        obj = inner
    return getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)


def _kernel_of(value: Any) -> Any:
    """The Triton kernel object ``value`` is (a TritonFunction of an earlier load: the one it
    adopted), or None."""
    host = value.host if _is_served_function(value) else value
    return host if _is_kernel(host) else None


def _replace(module: types.ModuleType, qualname: str, owner: _Owner) -> list[Any]:
    """Replace the kernel ``qualname`` of ``module`` by the owner's function: the object found at
    ``qualname`` and every global of the module holding the kernel whose function is
    ``module.qualname`` (``_k = triton.jit(_impl)`` included), the outermost decorator's object
    (``@triton.autotune`` over ``@triton.jit``) adopted; the objects replaced."""
    name = module.__name__
    places: list[tuple[Any, str, Any]] = []  # (holder, attribute, value)
    where = _holder(module, qualname)
    if where is not None and _kernel_of(getattr(where[0], where[1], None)) is not None:
        places.append((where[0], where[1], getattr(where[0], where[1])))
    for k, v in list(vars(module).items()):
        kernel = _kernel_of(v)
        if kernel is not None and _identity(kernel) == (name, qualname) and not any(p[2] is v for p in places):
            places.append((module, k, v))
    if not places:
        found = getattr(where[0], where[1], None) if where is not None else None
        what = f"{type(found).__name__}, not a Triton kernel" if found is not None else f"no {qualname} once imported"
        warnings.warn(f"khal: package {owner.package!r} (crate {owner.crate!r}) serves {name}.{qualname}, but "
                      f"{name} holds {what}: its launches are not served (rebuild the package from the module as "
                      "it is)", RuntimeWarning, stacklevel=3)
        return []
    function = owner.function(name, qualname)
    kernels = [_kernel_of(p[2]) for p in places]
    inner = {id(getattr(k, "fn", None)) for k in kernels}
    outermost = next((k for k in kernels if id(k) not in inner), kernels[0])
    if function.host is not outermost:
        function.adopt_host(outermost)
    replaced = []
    for holder, attr, value in places:
        if _kernel_of(value) is outermost and value is not function:
            setattr(holder, attr, function)
            replaced.append(value)
    return replaced


def _patch(module: types.ModuleType) -> list[tuple[Any, Any]]:
    """Replace every served kernel of ``module``; (original, replacement) of each."""
    name = module.__name__
    out = []
    for qualname in sorted(_by_module.get(name, ())):
        owner = _served.get((name, qualname))
        if owner is None:
            continue
        replaced = _replace(module, qualname, owner)
        if replaced:
            function = owner.function(name, qualname)
            out += [(original, function) for original in replaced]
    return out


def _patch_imported(modules: set[str]) -> None:
    """At ``load()``: patch the served modules already imported, and the names other imported modules
    of their top-level packages hold for the same kernel objects (``from .ops import kernel``)."""
    replaced: list[tuple[Any, Any]] = []
    for name in sorted(modules):
        mod = sys.modules.get(name)
        if isinstance(mod, types.ModuleType):
            replaced += _patch(mod)
    if not replaced:
        return
    tops = {_top(m) for m in modules}
    for name, mod in list(sys.modules.items()):
        if _top(name) not in tops or name in modules or not isinstance(mod, types.ModuleType):
            continue
        values = vars(mod)
        for original, function in replaced:
            for k, v in list(values.items()):
                if v is original:
                    setattr(mod, k, function)


# --- registration -----------------------------------------------------------------------------------

_FINDER = _Finder()


def _served_by(crate: Crate) -> dict[str, set[str]]:
    """module -> qualnames of the crate's entries importable at run time."""
    out: dict[str, set[str]] = {}
    for e in crate.entries:
        t = e.triton
        if t is not None and t.module and t.qualname:
            out.setdefault(t.module, set()).add(t.qualname)
    return out


def serve(kernels: KernelSet) -> None:
    """Serve the modules of a loaded package's Triton crates (``khal_runtime.load`` calls it): check
    companions (all before any is registered), register their kernels, patch those already imported."""
    crates: list[tuple[CrateKernels, dict[str, set[str]]]] = []
    for ck in kernels.crates.values():
        c = ck.crate
        if c.language != "triton":
            continue
        serves = c.triton.serves if c.triton is not None else None
        if serves is not None:
            check_companion(kernels.package, c.name, serves)
        modules = _served_by(c)
        if modules:
            crates.append((ck, modules))
            version = next((e.triton.triton_version for e in c.entries if e.triton is not None), None)
            if version:
                triton_standin.set_version(version)
    if not crates:
        return
    touched: set[str] = set()
    with _lock:
        for ck, modules in crates:
            owner = _Owner(kernels.package, ck.name, ck)
            for module, qualnames in modules.items():
                for q in qualnames:
                    held = _served.get((module, q))
                    if held is not None and (held.package, held.crate) != (owner.package, owner.crate):
                        warnings.warn(f"khal: {module}.{q} is served by package {held.package!r} (crate "
                                      f"{held.crate!r}) already; package {owner.package!r} (crate {owner.crate!r}) "
                                      "does not serve it", RuntimeWarning, stacklevel=3)
                        continue
                    _served[(module, q)] = owner
                    _by_module.setdefault(module, set()).add(q)
                    touched.add(module)
                parts = module.split(".")
                _scoped.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
                _packages.add(parts[0])
        if not sys.meta_path or sys.meta_path[0] is not _FINDER:  # first: before any import hook added since
            if _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
            sys.meta_path.insert(0, _FINDER)
        _patch_imported(touched)


def served_modules() -> dict[str, tuple[str, ...]]:
    """module -> the qualnames of its kernels the loaded packages serve."""
    return {m: tuple(sorted(qs)) for m, qs in sorted(_by_module.items())}
