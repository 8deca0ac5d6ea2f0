"""What the Triton worker (:mod:`hatch_khal.triton.worker`) reads of a kernel, with Triton imported
there: its parameters as the manifest records them (``TritonFacts.params``, from Triton's
``JITFunction.params``), constexpr values between Triton's objects and the manifest's
(``tl.dtype`` <-> :class:`~khal_runtime.manifest.TritonDtype`), and where a kernel is: a global of
one of the crate's source modules, or a ``__qualname__`` in a named module (a lock variant's, a
companion crate's).

Imported by the worker only (it imports Triton lazily, inside the functions that need it)."""

from __future__ import annotations

import os
from typing import Any, Mapping

from khal_runtime.manifest import ConstValue, TritonDtype, TritonParam

from hatch_khal.errors import ConfigError, SourceError

__all__ = ["const_value", "find_kernel", "kernel_params", "lookup", "triton_value"]


def const_value(where: str, value: Any) -> ConstValue:
    """A value as Triton takes it (a ``tl.constexpr`` unwrapped, a ``tl.dtype``) as the manifest's
    constexpr value; ConfigError naming ``where`` for what the manifest cannot record."""
    import triton.language as tl  # lazy: the worker's Triton

    if isinstance(value, tl.constexpr):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tl.dtype):
        return TritonDtype(dtype=value.name)
    raise ConfigError(f"{where} is {value!r} ({type(value).__name__}), which a precompiled variant cannot record "
                      "(an int, float, bool, string, tl.dtype or None)")


def triton_value(value: ConstValue) -> Any:
    """A manifest constexpr value as Triton's compile takes it (a dtype as its ``tl.dtype``)."""
    if isinstance(value, TritonDtype):
        import triton.language as tl  # lazy: the worker's Triton

        return tl.dtype(value.dtype)
    return value


def kernel_params(fn: Any, kernel: str) -> list[TritonParam]:
    """The kernel's whole signature, as its ``@triton.jit`` function's ``params`` say: which are
    constexprs (``is_constexpr``), defaults (a default the manifest cannot record is refused by
    name), ``do_not_specialize`` / ``do_not_specialize_on_alignment`` and the type an annotation
    forces."""
    out = []
    for p in fn.params:
        default: ConstValue = None
        if p.has_default:
            default = const_value(f"kernel {kernel!r}: the default of parameter {p.name!r}", p.default)
        annotation = p.annotation_type
        out.append(TritonParam(name=p.name, constexpr=bool(p.is_constexpr), default=default,
                               has_default=bool(p.has_default), do_not_specialize=bool(p.do_not_specialize),
                               do_not_specialize_on_alignment=bool(p.do_not_specialize_on_alignment),
                               annotation=annotation if isinstance(annotation, str) else ""))
    return out


def lookup(module: Any, qualname: str) -> Any:
    """``module``'s object at ``qualname`` (dotted for a nested one), None when there is none."""
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def find_kernel(modules: Mapping[str, Any], kernel: str, unwrap: Any, where: str, module: str | None = None,
                recorded: bool = False) -> tuple[str, Any]:
    """The crate module defining ``kernel`` (key of ``modules``: a source's path or a module's name)
    and the object there (under its @triton.autotune / @triton.heuristics, if any): the one module
    named (``module``, which must be one of the crate's), else exactly one of them. ``unwrap(obj)``
    gives the ``@triton.jit`` function under ``obj`` or None. ``recorded``: ``where`` is a lock
    variant's (the error says it no longer fits)."""
    if module is not None:
        if module not in modules:
            raise ConfigError(f"{where}: module {module!r} is not one of the crate's modules ({', '.join(modules)})")
        candidates = {module: modules[module]}
    else:
        candidates = dict(modules)
    found = []
    for key, m in candidates.items():
        obj = lookup(m, kernel)
        fn = unwrap(obj)
        if fn is not None and fn.fn.__module__ == m.__name__:
            found.append((key, obj))
    if len(found) == 1:
        return found[0]
    names = ", ".join(k for k, _ in found) if found else (f"module {module}" if module else
                                                          "none of the crate's sources")
    if recorded:
        raise ConfigError(f"{where} no longer fits kernel {kernel!r}: a @triton.jit function of that name is defined "
                          f"by {names}, not by exactly one; record it again (python -m hatch_khal triton record -- "
                          "...) or delete the variant from the lock file")
    raise ConfigError(f"{where}: option 'kernel' names {kernel!r}, a @triton.jit function (under @triton.autotune / "
                      f"@triton.heuristics or not) that {names} define{'s' if len(found) == 1 else ''}: "
                      "it must be defined in exactly one source of the crate")


def import_modules(names: list[str]) -> dict[str, Any]:
    """The modules a companion crate serves, imported by name from the build environment."""
    import importlib  # lazy: the worker only

    out = {}
    for name in names:
        try:
            out[name] = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the library's module failed to import
            raise SourceError(f"importing module {name} failed: {type(exc).__name__}: {exc}") from None
    return out


def module_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path else None
