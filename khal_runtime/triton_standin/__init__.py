"""khal's Triton stand-in: what host code written for Triton imports, in a process without Triton.

While a module that a loaded khal package serves executes (:mod:`khal_runtime.triton_serve`), and
Triton is not installed, ``import triton``, ``import triton.language as tl``,
``from triton.language.extra.libdevice import rsqrt`` and the like resolve to the module objects
made here. They hold:

* ``triton.jit`` (bare or called, ``do_not_specialize=`` ...), ``triton.autotune``,
  ``triton.heuristics``, ``triton.Config``, ``triton.cdiv``, ``triton.next_power_of_2``,
  ``triton.__version__`` (the Triton version the served kernels were built with);
* ``tl.constexpr`` (an annotation, and values ``tl.constexpr(0)``), ``tl.dtype`` and every dtype of
  ``triton.language`` by Triton's names (``tl.float32.name == "fp32"``), ``tl.pointer_type``;
* ``triton.runtime.jit.JITFunction`` / ``KernelInterface``, ``triton.runtime.autotuner.Autotuner`` /
  ``Heuristics`` (:mod:`.runtime`);
* every other name (``tl.program_id``, ``tl.math.rsqrt``, a libdevice function, any ``triton.*``
  submodule) is an inert placeholder: kernels name them, and kernels are never run here. Host code
  that calls or indexes one raises :class:`~khal_runtime.errors.TritonStandInError` naming it.

The module objects are made once per process and shared by every import; they are in
``sys.modules`` only while a served module executes (the serving layer removes them after), so
another library's ``importlib.util.find_spec("triton")`` still finds no Triton.
"""

from __future__ import annotations

import importlib.machinery
import types
from typing import Any, Callable

from khal_runtime.errors import TritonStandInError
from khal_runtime.triton_standin import language as _language
from khal_runtime.triton_standin import runtime as _runtime

__all__ = ["Placeholder", "is_kernel", "is_module", "module", "set_version", "spec"]

#: ``triton.__version__`` of the stand-in: the Triton version the served kernels were built with
#: (:func:`set_version`, by the serving layer before a served module runs)
_version = "3.6.0"

_LANGUAGE: dict[str, Any] = {"constexpr": _language.constexpr, "dtype": _language.dtype,
                             "pointer_type": _language.pointer_type, **_language.VALUES}
_RUNTIME: dict[str, Any] = {"JITFunction": _runtime.JITFunction, "KernelInterface": _runtime.KernelInterface,
                            "Autotuner": _runtime.Autotuner, "Heuristics": _runtime.Heuristics,
                            "Config": _runtime.Config, "autotune": _runtime.autotune,
                            "heuristics": _runtime.heuristics, "jit": _runtime.jit}
_TOP: dict[str, Any] = {"jit": _runtime.jit, "autotune": _runtime.autotune, "heuristics": _runtime.heuristics,
                        "Config": _runtime.Config, "cdiv": _runtime.cdiv,
                        "next_power_of_2": _runtime.next_power_of_2, "JITFunction": _runtime.JITFunction,
                        "KernelInterface": _runtime.KernelInterface}

#: module name -> the names it holds (besides placeholders) and its submodules reached as attributes
_NAMESPACES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "triton": (_TOP, ("language", "runtime")),
    "triton.language": (_LANGUAGE, ("core", "math", "extra")),
    "triton.language.core": (_LANGUAGE, ()),
    "triton.runtime": (_RUNTIME, ("jit", "autotuner")),
    "triton.runtime.jit": (_RUNTIME, ()),
    "triton.runtime.autotuner": (_RUNTIME, ()),
}

_ORIGIN = "khal_runtime.triton_standin"

#: what host code may use, for the messages
PROVIDED = ("triton.jit", "triton.autotune", "triton.heuristics", "triton.Config", "triton.cdiv",
            "triton.next_power_of_2", "triton.__version__", "triton.language.constexpr", "triton.language.dtype",
            "the triton.language dtypes (tl.float32, tl.bfloat16, ...)", "triton.language.pointer_type")


class Placeholder:
    """An unknown name of the stand-in (``tl.program_id``, ``libdevice.rsqrt``): inert, for kernels to
    name; calling or indexing it is host code asking for a Triton API the stand-in lacks."""

    __slots__ = ("_path",)

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> Placeholder:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self._path}.{name}")

    def _missing(self) -> TritonStandInError:
        return missing(self._path)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._missing()

    def __getitem__(self, key: Any) -> Any:
        raise self._missing()

    def __repr__(self) -> str:
        return f"<khal Triton stand-in placeholder {self._path}>"


def missing(path: str) -> TritonStandInError:
    """The error for host code using ``path``, a Triton API the stand-in does not have."""
    return TritonStandInError(
        f"{path}: Triton is not installed in this process, and khal's Triton stand-in (what `import triton` gives "
        f"the modules a khal package serves) does not provide it to host code; it provides {', '.join(PROVIDED)}, "
        "and inert placeholders for the device functions kernels name. Install triton, or keep this use inside a "
        "@triton.jit kernel")


class _Loader:
    """Loads a stand-in module: the one object made for its name."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return module(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_LOADER = _Loader()
_modules: dict[str, types.ModuleType] = {}


def spec(name: str) -> importlib.machinery.ModuleSpec:
    """The spec of stand-in module ``name`` (``triton`` or ``triton.<anything>``)."""
    return importlib.machinery.ModuleSpec(name, _LOADER, origin=_ORIGIN, is_package=True)  # type: ignore[arg-type]


def _getattr_of(name: str, submodules: tuple[str, ...]) -> Callable[[str], Any]:
    def __getattr__(attr: str) -> Any:  # noqa: N807 - a module's __getattr__ (PEP 562)
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(f"module {name!r} (khal's Triton stand-in) has no attribute {attr!r}")
        if attr in submodules:
            return module(f"{name}.{attr}")
        return Placeholder(f"{name}.{attr}")

    return __getattr__


def module(name: str) -> types.ModuleType:
    """The stand-in module ``name`` (made on first use, then the same object)."""
    m = _modules.get(name)
    if m is not None:
        return m
    names, submodules = _NAMESPACES.get(name, ({}, ()))
    m = types.ModuleType(name, f"khal's Triton stand-in for {name} (Triton is not installed)")
    m.__dict__.update(names)
    m.__spec__ = spec(name)
    m.__loader__ = _LOADER  # type: ignore[assignment]
    m.__path__ = []
    m.__package__ = name
    m.__dict__["__khal_standin__"] = True
    m.__dict__["__getattr__"] = _getattr_of(name, submodules)
    if name == "triton":
        m.__dict__["__version__"] = _version
    return _modules.setdefault(name, m)


def set_version(version: str) -> None:
    """``triton.__version__`` of the stand-in (the Triton version the served kernels were built with)."""
    global _version
    _version = version
    top = _modules.get("triton")
    if top is not None:
        top.__dict__["__version__"] = version


def is_module(obj: Any) -> bool:
    """Whether ``obj`` is one of the stand-in's module objects."""
    return isinstance(obj, types.ModuleType) and obj.__dict__.get("__khal_standin__") is True


def made() -> dict[str, types.ModuleType]:
    """The stand-in modules made so far, by name."""
    return dict(_modules)


def is_kernel(obj: Any) -> bool:
    """Whether ``obj`` is a stand-in kernel (``@triton.jit`` / ``autotune`` / ``heuristics`` object)."""
    return isinstance(obj, _runtime.KernelInterface)
