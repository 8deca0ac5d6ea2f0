"""Where a Triton kernel's ``@triton.heuristics`` and its JIT come from at run time: the kernel's
original module global (real Triton's ``Heuristics`` / ``Autotuner`` / ``JITFunction``, or the
stand-in's: the same attribute names), adopted (:meth:`TritonFunction.adopt_host
<khal_runtime.triton_call.TritonFunction.adopt_host>`) or imported from the kernel's module
(``TritonFacts.module`` / ``qualname``) at the first need; and the check an instance family of such
a kernel makes of each call (:func:`heuristic_check`).
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Any, Callable

from khal_runtime.errors import KhalError, TritonAssumptionError
from khal_runtime.triton import _MISSING as _FAMILY_MISSING
from khal_runtime.triton import TritonKernel
from khal_runtime.triton_record import canon, show

__all__ = ["Host", "MISSING", "heuristic_check", "is_real_triton", "unwrap_host"]

#: a parameter the call did not give (a heuristic's, an autotuned config's, or one missing)
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()
#: a heuristic: (the constexpr it computes, its function of the call's arguments by name)
Heuristic = tuple[str, Callable[[dict[str, Any]], Any]]


def unwrap_host(obj: Any) -> tuple[list[Heuristic], Any, Any]:
    """(the heuristics, outermost first, as (constexpr, function of the args dict); the autotuner or
    None; the JIT function) of a kernel's module global: real Triton's ``Heuristics`` /
    ``Autotuner`` / ``JITFunction``, or the stand-in's (the same attribute names: ``values``,
    ``configs``, ``fn``)."""
    heur: list[Heuristic] = []
    tuner = None
    o = obj
    for _ in range(32):
        values = getattr(o, "values", None)
        if isinstance(values, dict):
            heur.extend(values.items())
        elif getattr(o, "configs", None) is not None and tuner is None:
            tuner = o
        fn = getattr(o, "fn", None)
        if fn is None or isinstance(fn, types.FunctionType):
            return heur, tuner, o
        o = fn
    return heur, tuner, o


def is_real_triton(obj: Any) -> bool:
    mod = getattr(type(obj), "__module__", "") or ""
    return mod == "triton" or mod.startswith("triton.")


class Host:
    """Where a kernel's heuristics (and its JIT, for the fallback) come from: the object
    :meth:`TritonFunction.adopt_host` was given, else the kernel's module's global, imported at the
    first need (``TritonFacts.module`` / ``qualname``)."""

    def __init__(self, module: str | None, qualname: str) -> None:
        self.module, self.qualname = module, qualname
        self.obj: Any = None
        self._heur: list[Heuristic] | None = None
        self._error: str | None = None

    def adopt(self, obj: Any) -> None:
        self.obj, self._heur, self._error = obj, None, None

    def imported(self) -> Any:
        """The kernel's module global (its original object when the module holds a TritonFunction);
        raises ImportError / AttributeError."""
        if not self.module:
            raise ImportError("the build recorded no module the kernel can be imported from")
        o: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            o = getattr(o, part)
        if callable(getattr(o, "adopt_host", None)):  # khal's TritonFunction (a served module): its original
            o = o.host
            if o is None:
                raise ImportError(f"{self.module}.{self.qualname} is khal's TritonFunction with no original adopted")
        return o

    def heuristics(self, wanted: tuple[str, ...], who: str) -> list[Heuristic]:
        """The heuristics computing ``wanted``; a named KhalError when they cannot be read."""
        if self._heur is not None:
            return self._heur
        if self._error is not None:
            raise KhalError(self._error)
        obj = self.obj
        if obj is None:
            try:
                obj = self.imported()
            except Exception as exc:  # noqa: BLE001 - any failure importing the user's module is reported by name
                self._error = (
                    f"{who}: its @triton.heuristics compute {', '.join(wanted)} at each call, from the kernel's "
                    f"module, which cannot be read here: {type(exc).__name__}: {exc} (module "
                    f"{self.module or '(none recorded)'}, {self.qualname}). Import the module once with Triton, or "
                    "khal's stand-in, available (a companion package installs it), or give the kernel's original "
                    "object: kernels.<kernel>.adopt_host(obj)")
                raise KhalError(self._error) from None
        heur, _, _ = unwrap_host(obj)
        have = [n for n, _ in heur]
        lost = [n for n in wanted if n not in have]
        if lost:
            raise KhalError(f"{who}: the build recorded heuristics for {', '.join(lost)}, which the kernel's "
                            f"@triton.heuristics ({', '.join(have) or 'none'}) do not compute: rebuild the package")
        self._heur = heur
        return heur

    def try_heuristics(self, wanted: tuple[str, ...], who: str) -> list[Heuristic] | None:
        try:
            return self.heuristics(wanted, who)
        except KhalError:
            return None

    def jit(self) -> Any:
        """Triton's own kernel object (real Triton), or None where Triton or the module is not there."""
        if self.obj is not None and is_real_triton(self.obj):
            return self.obj
        if importlib.util.find_spec("triton") is None:
            return None
        try:
            o = self.imported()
        except Exception:  # noqa: BLE001 - not importable: no fallback
            return None
        return o if is_real_triton(o) else None


def heuristic_check(family: TritonKernel, host: Host) -> Callable[..., None] | None:
    """For an instance family whose kernel has ``@triton.heuristics``: a check the family's call
    makes of its arguments that each heuristic computes the value its variants were compiled with
    (a family has one set of constexprs), else :class:`~khal_runtime.errors.TritonAssumptionError`
    (before, a call breaking the premise ran the variant compiled for it, an ``EVEN = true`` twin
    unmasked over a ragged tail). Without the kernel's module (no Triton, no stand-in) it checks nothing."""
    facts = family.variants[0].entry.triton
    wanted = tuple(facts.heuristics)
    if not wanted or family.tuned:
        return None
    names = family.arg_names
    compiled = {n: facts.constexprs[n] for n in wanted if n in facts.constexprs}
    consts = dict(facts.constexprs)
    state: list[Any] = [None]  # the heuristics, once read ([] when they cannot be)

    def check(*args: Any) -> None:
        heur = state[0]
        if heur is None:
            heur = state[0] = host.try_heuristics(wanted, family.name) or []
        if not heur or len(args) != len(names) or any(a is _FAMILY_MISSING for a in args):
            return
        d = {**consts, **dict(zip(names, args))}
        for n, fn in heur:
            d[n] = v = fn(d)
            if n in compiled and canon(v) != canon(compiled[n]):
                raise TritonAssumptionError(
                    f"{family.name}: the kernel's @triton.heuristics compute {n} = {show(canon(v))} for this call, "
                    f"and every variant of the instance was compiled with {n} = {show(canon(compiled[n]))} (it would "
                    f"run code for another premise). Call the kernel's own launcher (kernels.{facts.qualname or facts.kernel}"
                    f"[grid](...): it picks the variant by the heuristic), or build an instance with {n} = "
                    f"{show(canon(v))}")
    return check
