"""The stand-in's ``triton.jit`` / ``triton.autotune`` / ``triton.heuristics`` / ``triton.Config`` and
the host helpers ``triton.cdiv`` / ``triton.next_power_of_2``.

The decorated objects keep what khal's run time reads of Triton's own (notes/triton-jit.md,
"Interfaces between the run-time helpers"): ``JITFunction.fn`` / ``.arg_names`` /
``.do_not_specialize``; ``Heuristics.values`` / ``.fn``; ``Autotuner.configs`` (``.kwargs``,
``.num_warps``, ``.num_stages``, ``.num_ctas``, ``.maxnreg``) / ``.keys`` / ``.fn``. They compile
nothing: a kernel a loaded khal package serves is replaced by its ``TritonFunction`` once its module
has run (:mod:`khal_runtime.triton_serve`); a launch of one that no package serves raises
:class:`~khal_runtime.errors.TritonStandInError` naming it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Optional

from khal_runtime.errors import TritonStandInError

__all__ = ["Autotuner", "Config", "Heuristics", "JITFunction", "KernelInterface", "autotune", "cdiv", "heuristics",
           "jit", "next_power_of_2"]


def cdiv(x: int, y: int) -> int:
    """``ceil(x / y)`` for integers (Triton's ``triton.cdiv``)."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """The smallest power of two at least ``n`` (Triton's ``triton.next_power_of_2``: 0 for ``n <= 0``)."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


class KernelInterface:
    """What ``kernel[grid](...)`` is called on: a served kernel is never one of these once its module
    has run (its ``TritonFunction`` replaces it); one that is launched anyway is a kernel no loaded
    package serves."""

    fn: Any

    @property
    def _jit(self) -> JITFunction:
        obj: Any = self
        while not isinstance(obj, JITFunction):
            obj = obj.fn
        return obj

    def _unserved(self) -> TritonStandInError:
        j = self._jit
        return TritonStandInError(
            f"kernel {j.module}.{j.__qualname__}: no loaded khal package serves it, and Triton is not installed "
            "(this is khal's Triton stand-in, which compiles nothing). Build it into the package that serves "
            f"{j.module} (record its launches: python -m hatch_khal triton record -- <command>), import that "
            "package before this one, or install triton")

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        raise self._unserved()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise self._unserved()

    def warmup(self, *args: Any, **kwargs: Any) -> Any:
        raise self._unserved()


class JITFunction(KernelInterface):
    """``@triton.jit``'s object: the Python function (``fn``) and what Triton's records of it."""

    def __init__(self, fn: Callable[..., Any], version: Any = None,
                 do_not_specialize: Optional[Iterable[int | str]] = None,
                 do_not_specialize_on_alignment: Optional[Iterable[int | str]] = None,
                 debug: Optional[bool] = None, noinline: Optional[bool] = None, repr: Any = None,
                 launch_metadata: Any = None) -> None:
        if not callable(fn):
            raise TypeError(f"triton.jit: {fn!r} is not a function")
        self.fn = fn
        self.module = fn.__module__
        self.version = version
        self.arg_names = list(inspect.signature(fn).parameters)
        self.do_not_specialize = list(do_not_specialize or ())
        self.do_not_specialize_on_alignment = list(do_not_specialize_on_alignment or ())
        self.debug = debug
        self.noinline = noinline
        self._repr = repr
        self.launch_metadata = launch_metadata
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__module__ = fn.__module__
        self.__doc__ = fn.__doc__
        self.__globals__ = getattr(fn, "__globals__", {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TritonStandInError(f"{self.module}.{self.__qualname__}: cannot call a @triton.jit function outside "
                                 "a kernel (launch it with kernel[grid](...))")

    def __repr__(self) -> str:
        return f"<khal Triton stand-in JITFunction {self.module}.{self.__qualname__}>"


def jit(fn: Optional[Callable[..., Any]] = None, *, version: Any = None, repr: Any = None,
        launch_metadata: Any = None, do_not_specialize: Optional[Iterable[int | str]] = None,
        do_not_specialize_on_alignment: Optional[Iterable[int | str]] = None, debug: Optional[bool] = None,
        noinline: Optional[bool] = None) -> Any:
    """``@triton.jit`` or ``@triton.jit(do_not_specialize=..., ...)``."""

    def decorator(f: Callable[..., Any]) -> JITFunction:
        return JITFunction(f, version=version, do_not_specialize=do_not_specialize,
                           do_not_specialize_on_alignment=do_not_specialize_on_alignment, debug=debug,
                           noinline=noinline, repr=repr, launch_metadata=launch_metadata)

    return decorator if fn is None else decorator(fn)


class Config:
    """``triton.Config(kwargs, num_warps=4, num_stages=3, num_ctas=1, maxnreg=None, pre_hook=None)``."""

    def __init__(self, kwargs: dict[str, Any], num_warps: int = 4, num_stages: int = 3, num_ctas: int = 1,
                 maxnreg: Optional[int] = None, pre_hook: Any = None, ir_override: Any = None) -> None:
        self.kwargs = dict(kwargs)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.num_ctas = num_ctas
        self.maxnreg = maxnreg
        self.pre_hook = pre_hook
        self.ir_override = ir_override

    def all_kwargs(self) -> dict[str, Any]:
        """The constexprs and the options, as one dict (Triton's ``Config.all_kwargs``)."""
        options = {"num_warps": self.num_warps, "num_ctas": self.num_ctas, "num_stages": self.num_stages,
                   "maxnreg": self.maxnreg}
        return {**self.kwargs, **{k: v for k, v in options.items() if v is not None}}

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.all_kwargs().items())

    def __repr__(self) -> str:
        return f"triton.Config({self})"


class Heuristics(KernelInterface):
    """``@triton.heuristics(values)``'s object: ``values`` maps a constexpr's name to a function of
    the call's arguments (a dict by name)."""

    def __init__(self, fn: Any, arg_names: list[str], values: dict[str, Callable[[dict[str, Any]], Any]]) -> None:
        self.fn = fn
        self.arg_names = arg_names
        self.values = values


def heuristics(values: dict[str, Callable[[dict[str, Any]], Any]]) -> Callable[[Any], Heuristics]:
    """``@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})``."""

    def decorator(fn: Any) -> Heuristics:
        return Heuristics(fn, list(fn.arg_names), values)

    return decorator


class Autotuner(KernelInterface):
    """``@triton.autotune(configs, key, ...)``'s object: ``configs``, ``keys`` (the argument names
    whose values select a config), ``fn`` (what it wraps) and the options as given."""

    def __init__(self, fn: Any, arg_names: list[str], configs: list[Config], key: list[str],
                 reset_to_zero: Optional[list[str]] = None, restore_value: Optional[list[str]] = None,
                 pre_hook: Any = None, post_hook: Any = None, prune_configs_by: Optional[dict[str, Any]] = None,
                 warmup: Any = None, rep: Any = None, use_cuda_graph: bool = False, do_bench: Any = None,
                 cache_results: bool = False) -> None:
        self.fn = fn
        self.base_fn = self._jit
        self.arg_names = arg_names
        self.configs = list(configs) if configs else [Config({})]
        self.keys = list(key)
        self.reset_to_zero = list(reset_to_zero or ())
        self.restore_value = list(restore_value or ())
        self.pre_hook = pre_hook
        self.post_hook = post_hook
        self.user_defined_pre_hook = pre_hook is not None
        self.user_defined_post_hook = post_hook is not None
        prune = prune_configs_by or {}
        self.perf_model = prune.get("perf_model")
        self.configs_top_k = prune.get("top_k", 1.0)
        self.early_config_prune = prune.get("early_config_prune")
        self.num_warmups = warmup
        self.num_reps = rep
        self.use_cuda_graph = use_cuda_graph
        self.do_bench = do_bench
        self.cache_results = cache_results


def autotune(configs: list[Config], key: list[str], prune_configs_by: Optional[dict[str, Any]] = None,
             reset_to_zero: Optional[list[str]] = None, restore_value: Optional[list[str]] = None,
             pre_hook: Any = None, post_hook: Any = None, warmup: Any = None, rep: Any = None,
             use_cuda_graph: bool = False, do_bench: Any = None, cache_results: bool = False
             ) -> Callable[[Any], Autotuner]:
    """``@triton.autotune(configs=[triton.Config(...)], key=[...], ...)``."""

    def decorator(fn: Any) -> Autotuner:
        return Autotuner(fn, list(fn.arg_names), configs, key, reset_to_zero=reset_to_zero,
                         restore_value=restore_value, pre_hook=pre_hook, post_hook=post_hook,
                         prune_configs_by=prune_configs_by, warmup=warmup, rep=rep, use_cuda_graph=use_cuda_graph,
                         do_bench=do_bench, cache_results=cache_results)

    return decorator
