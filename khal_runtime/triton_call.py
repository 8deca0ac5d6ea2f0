"""A Triton kernel's own call: ``kernels.<kernel>[grid](...)`` as Triton's JIT takes it, with no Triton.

``kernels.<kernel>`` (the ``@triton.jit`` function's name) is a :class:`TritonFunction` over every
variant of the kernel the crate ships (hand-written instances, and the variants of the lock file,
``python -m hatch_khal triton record``). ``k[grid](*args, **kwargs)`` / ``k.run(*args, grid=...)``:

* every parameter of the kernel, in its order, positional or keyword, constexprs included, the
  kernel's defaults applied; ``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg`` (Triton's
  defaults 4, 3, 1, none) and khal's ``stream=`` (default: PyTorch's current stream of the first
  pointer's device for torch tensors, else this thread's stream). An unknown keyword is an
  :class:`~khal_runtime.errors.ArgumentError` (a ``TypeError``) naming it and the parameters;
* ``grid``: an int, up to three, or a callable of the meta dict (every argument by name, constexprs
  and heuristic values included, and an autotuned kernel's config), as Triton's ``bound_args``;
* per call: the kernel's ``@triton.heuristics`` (read from the host object :meth:`TritonFunction.adopt_host`
  was given, else from the kernel's module, imported at the first call), the options, the JIT's
  specialisation of every argument (:mod:`khal_runtime.triton_spec`); then the variants compiled
  with exactly those constexprs (heuristic values included), options, argument types and ``None``
  arguments, among which the one with exactly the JIT's specialisation if it is built, else the
  most specialised whose assumptions all hold, argument by argument. Those variants are one
  instance family (:class:`~khal_runtime.triton.TritonKernel`), made for them at the first such
  call: its generated call, memo and checks launch them. An autotuned kernel's families hold every
  config's variants; the config is chosen as a family chooses it (timed per key, or a rule);
* no built variant covers the call: :class:`~khal_runtime.errors.TritonMissingVariantError`, naming
  the nearest built variants and the lock-file table that would build it; or, with the crate's
  ``jit-fallback`` (``KHAL_TRITON_JIT_FALLBACK`` overrides) and Triton installed, the call goes to
  Triton's JIT (once said per missing variant, which is appended to ``KHAL_TRITON_RECORD``).

The call is Python generated per kernel (:func:`khal_runtime.generated.define`, made at its first
call, ``k.source``) with the kernel's own signature. A call of a shape seen before (the same
constexpr objects or equal ones, the same options, ``None`` where it was, each int of the same
type, each float a float) goes straight to the family it chose then (four shapes remembered per
kernel): the family's own call checks the arrays' dtypes, alignment and the rest, and a call it
refuses before launching (another dtype, ``None`` for a pointer, every variant's assumptions
broken) is bound and chosen again here.

``KHAL_TRITON_STATS=1`` counts, per kernel, the launches whose variant had exactly the JIT's
specialisation and the others (:func:`stats`; a table on stderr at exit). Off by default: no cost.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import warnings
from typing import Any, Callable, Iterable

from khal_runtime.abi import env_flag
from khal_runtime.errors import (ArgumentError, KhalError, TritonAssumptionError, TritonJitFallbackWarning,
                                 TritonMissingVariantError)
from khal_runtime.generated import define
from khal_runtime.triton import TritonKernel
from khal_runtime.triton_host import MISSING, Heuristic, Host
from khal_runtime.triton_record import append_record, canon, lock_table, show, uncanon
from khal_runtime.triton_spec import SpecError, as_index, int_type, pointer_type, specialize_param, spelling

__all__ = ["FALLBACK_VAR", "STATS_VAR", "TritonFunction", "TritonFunctionBound", "group_functions", "stats"]

#: ``KHAL_TRITON_JIT_FALLBACK``: a call no variant covers goes to Triton's JIT (on / off: overrides the crate's option)
FALLBACK_VAR = "KHAL_TRITON_JIT_FALLBACK"
#: ``KHAL_TRITON_STATS``: count exact-JIT-specialisation launches per kernel
STATS_VAR = "KHAL_TRITON_STATS"
#: the options a call may give, and Triton's defaults for them
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
OPTION_DEFAULTS = (4, 3, 1, None)
_OPTION_SET = frozenset(OPTIONS)
_NO_OPTIONS = (None,) * len(OPTIONS)
#: the options tuples calls gave, one object per value
_interned: dict[tuple[Any, ...], tuple[Any, ...]] = {}
#: call shapes remembered per kernel (the generated call checks them in turn)
SHAPES = 4
#: a shape slot's field no argument is
_NOMATCH: Any = type("NoMatch", (), {"__repr__": lambda self: "<empty>"})()

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_INT_RANGES = {"i32": (_I32_MIN, _I32_MAX, True), "i64": (-(1 << 63), (1 << 63) - 1, False),
               "u64": (1 << 63, (1 << 64) - 1, True)}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# -- counting (KHAL_TRITON_STATS) -----------------------------------------------------------------

_STATS_ON = env_flag(os.environ.get(STATS_VAR), STATS_VAR)
#: "crate.kernel" -> [launches of the JIT's exact variant, of another variant, through the JIT fallback]
_stats: dict[str, list[int]] = {}
_stats_lock = threading.Lock()


def stats() -> dict[str, dict[str, int]]:
    """Per kernel (``crate.kernel``), the launches counted since ``KHAL_TRITON_STATS=1`` was read
    (at import): ``exact`` (the variant had exactly the JIT's specialisation), ``other`` (another
    built variant whose assumptions held), ``jit`` (the JIT fallback). Empty when the variable is off."""
    with _stats_lock:
        return {k: {"exact": v[0], "other": v[1], "jit": v[2]} for k, v in sorted(_stats.items())}


def _count(key: str, which: int) -> None:
    with _stats_lock:
        _stats.setdefault(key, [0, 0, 0])[which] += 1


def _print_stats() -> None:
    got = stats()
    if not got:
        return
    width = max(len("kernel"), *(len(k) for k in got))
    lines = ["khal Triton launches (KHAL_TRITON_STATS=1): the variant the JIT would have compiled, another, the JIT",
             f"  {'kernel':<{width}}  {'exact':>8}  {'other':>8}  {'JIT':>8}"]
    for k, v in got.items():
        lines.append(f"  {k:<{width}}  {v['exact']:>8}  {v['other']:>8}  {v['jit']:>8}")
    print("\n".join(lines), file=sys.stderr)


if _STATS_ON:
    atexit.register(_print_stats)


# -- the kernel's own call -------------------------------------------------------------------------

class _Variant:
    """What a call is matched against, of one variant (entry) of the kernel."""

    __slots__ = ("kernel", "name", "cx", "options", "types", "config", "spec", "facts")

    def __init__(self, kernel: Any, params: tuple[Any, ...]) -> None:
        t = kernel.entry.triton
        self.kernel, self.name, self.facts = kernel, kernel.entry.name, t
        self.config = t.config
        self.options = (t.num_warps, t.num_stages, t.num_ctas or 1, t.maxnreg)
        nones, ones, div = set(t.nones), set(t.ones), set(t.divisible)
        types_ = dict(zip(t.names, t.types))
        self.cx: dict[str, Any] = {}
        self.types: dict[str, str] = {}
        spec: list[tuple[Any, Any]] = []
        for p in params:
            if p.constexpr:
                if p.name in t.constexprs:
                    self.cx[p.name] = canon(t.constexprs[p.name])
                elif p.has_default:
                    self.cx[p.name] = canon(p.default)
                continue
            if p.name in nones:
                self.types[p.name] = "none"
                spec.append(("constexpr", None))
            elif p.name in types_:
                self.types[p.name] = _norm_type(types_[p.name])
                spec.append(("constexpr", 1) if p.name in ones else
                            (_norm_type(types_[p.name]), "D" if p.name in div else None))
            else:
                self.types[p.name] = "?"
                spec.append(("?", None))
        self.spec = tuple(spec)

    def describe(self, params: tuple[Any, ...]) -> str:
        parts = []
        t = self.facts
        for p in params:
            if p.constexpr:
                if p.name in self.cx:
                    parts.append(f"{p.name}={show(self.cx[p.name])}")
            elif self.types[p.name] == "none":
                parts.append(f"{p.name}=None")
            else:
                ty = self.types[p.name]
                parts.append(f"{p.name}: {ty}{':1' if p.name in t.ones else ':16' if p.name in t.divisible else ''}")
        opts = f"num_warps={self.options[0]}, num_stages={self.options[1]}"
        if self.options[2] != 1:
            opts += f", num_ctas={self.options[2]}"
        if self.options[3] is not None:
            opts += f", maxnreg={self.options[3]}"
        if self.config is not None:
            opts += f", config {self.config}"
        return f"{self.name} ({', '.join(parts)}; {opts})"


def _norm_type(t: str) -> str:
    """A Triton type with ``i1`` spelt ``u1`` (Triton's canonical name; instances may write ``i1``)."""
    if t == "i1":
        return "u1"
    if t.startswith("*") and t.endswith("i1") and t[1:] in ("i1", "ki1"):
        return t[:-2] + "u1"
    return t


class _Call:
    """One call, bound and specialised (the slow path's record of it)."""

    __slots__ = ("values", "options", "raw_options", "cx", "types", "spec", "key", "runtime")

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.options: tuple[Any, ...] | None = None
        #: the options as the call gave them (None: not given)
        self.raw_options: tuple[Any, ...] = (None,) * len(OPTIONS)
        self.cx: dict[str, Any] = {}
        self.types: dict[str, str] = {}
        self.spec: dict[str, tuple[Any, Any]] = {}
        self.key: tuple[Any, ...] = ()
        self.runtime: list[Any] = []


class TritonFunction:
    """``kernels.<kernel>``: a ``@triton.jit`` kernel's own call over every variant the crate built
    for it (module docstring). ``name`` its qualname, ``crate`` its crate's name, ``module`` /
    ``qualname`` where it is importable (``TritonFacts.module``), ``host`` the original object once
    adopted, ``params`` its whole signature (:class:`~khal_runtime.manifest.TritonParam`)."""

    def __init__(self, crate: Any, name: str, variants: list[Any]) -> None:
        self.crate: str = crate.name
        self._ck = crate
        first = variants[0].entry.triton
        self.name: str = name
        self.module: str | None = first.module
        self.qualname: str | None = first.qualname or first.kernel
        self.params: tuple[Any, ...] = tuple(first.params)
        for k in variants[1:]:
            if tuple(k.entry.triton.params) != self.params:
                raise KhalError(f"Triton kernel {name!r} of crate {self.crate!r}: entries {variants[0].entry.name!r} "
                                f"and {k.entry.name!r} record different signatures; rebuild the package")
        names = [p.name for p in self.params]
        clash = [n for n in names if n in OPTIONS or n == "stream" or n.startswith("_khal")]
        if clash or not all(_IDENT.match(n) for n in names):
            raise KhalError(f"Triton kernel {name!r}: parameter(s) {', '.join(clash or names)} cannot be called by name "
                            "(num_warps, num_stages, num_ctas, maxnreg and stream are the launch's options)")
        self.kernels = list(variants)
        self.tuned = any(k.entry.triton.config is not None for k in variants)
        self.heuristics: tuple[str, ...] = tuple(first.heuristics)
        self._host = Host(self.module, self.qualname or name)
        self._variants: list[_Variant] | None = None
        #: call key -> the family launching it (None: no variant covers it)
        self._families: dict[tuple[Any, ...], TritonKernel | None] = {}
        self._fam_lock = threading.Lock()
        #: the remembered call shapes (the generated call checks them in turn; newest first)
        self._shapes: list[tuple[Any, ...]] = []
        self._makers: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = None
        self._grids: dict[Any, Callable[..., None]] = {}
        #: the option keywords of the last call that gave some, and their options tuple (:meth:`_options`)
        self._options_last: list[Any] = [_NOMATCH, None]
        self._source = ""
        #: call keys whose missing variant went to the JIT (said once each)
        self._jitted: set[tuple[Any, ...]] = set()
        self._stats_key = f"{self.crate}.{name}"

    # -- the host object -------------------------------------------------------------------------

    @property
    def host(self) -> Any:
        """The kernel's original object (JITFunction / Autotuner / Heuristics), once adopted."""
        return self._host.obj

    def adopt_host(self, obj: Any) -> None:
        """Take ``obj`` (the kernel's original module global: real Triton's or the stand-in's) as the
        source of the kernel's heuristics and of its JIT (the fallback)."""
        self._host.adopt(obj)

    def __repr__(self) -> str:
        return f"<Triton kernel {self.crate}.{self.name}: {len(self.kernels)} variant(s)>"

    # -- the call --------------------------------------------------------------------------------

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        """``k[grid](*args, **kwargs)``: the kernel's call over ``grid`` (kept per int / tuple grid)."""
        t = type(grid)
        if t is tuple or t is int:
            try:
                go = self._grids.get(grid)
            except TypeError:  # unhashable inside: the launch names what is wrong
                return self._launcher(grid)
            if go is None:
                go = self._launcher(grid)
                if len(self._grids) < 64:
                    self._grids[grid] = go
            return go
        return self._launcher(grid)

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> None:
        """Triton's ``KernelInterface.run``: ``k.run(*args, grid=grid, **kwargs)``; ``warmup=True``
        chooses the variant (and checks a call would find one) without launching."""
        if warmup:
            self._launcher(grid)  # (the call generated)
            self._warmup(grid, args, kwargs)
            return
        self[grid](*args, **kwargs)

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> None:
        self.run(*args, grid=grid, warmup=True, **kwargs)

    def bind(self, *args: Any, stream: Any = None, **kwargs: Any) -> TritonFunctionBound:
        """``b = k.bind(*args, **kwargs)``, then ``b(grid)``: the call's arguments (as ``k[grid]``
        takes them: positional or keyword, constexprs, options) specialised, checked and packed once,
        the variant chosen as a call with them would; each ``b(grid)`` launches it (the family's bound
        launch, :meth:`TritonKernel.bind`). ``grid``: an int, a tuple, or a callable given the meta
        dict, as the call's. A call no built variant covers is the call's named error, now."""
        c, fam = self._resolve("bind()", args, kwargs)
        return TritonFunctionBound(fam.bind(*c.runtime, stream=stream), self, c)

    @property
    def source(self) -> str:
        """The generated call's Python (made now if the kernel was not called yet)."""
        self._make()
        return self._source

    def _launcher(self, grid: Any) -> Callable[..., None]:
        plain, callable_grid = self._makers or self._make()
        t = type(grid)
        go = callable_grid(grid) if t is not int and t is not tuple and callable(grid) else plain(grid)
        go.__qualname__ = go.__name__ = self._fname
        return go  # type: ignore[no-any-return]

    # -- the generated call ----------------------------------------------------------------------

    def _prepare(self) -> list[_Variant]:
        vs = self._variants
        if vs is None:
            vs = self._variants = [_Variant(k, self.params) for k in self.kernels]
        return vs

    def _kinds(self) -> dict[str, tuple[str, bool]]:
        """Per runtime parameter: how a repeated call's shape is checked (``ptr`` nothing, ``int`` its
        range, ``float`` / ``bool`` its type, ``fixed`` nothing (annotated), ``mixed`` its type code),
        and whether some variant was compiled with it None."""
        out: dict[str, tuple[str, bool]] = {}
        vs = self._prepare()
        for p in self.params:
            if p.constexpr:
                continue
            tys = {v.types[p.name] for v in vs}
            none = "none" in tys
            tys.discard("none")
            if p.annotation:
                kind = "fixed"
            elif tys and all(t.startswith("*") for t in tys):
                kind = "ptr"
            elif tys and tys <= {"i32", "i64", "u64"}:
                kind = "int"
            elif tys == {"fp32"}:
                kind = "float"
            elif tys == {"u1"}:
                kind = "bool"
            elif not tys:
                kind = "ptr"  # None in every variant
            else:
                kind = "mixed"
            out[p.name] = (kind, none)
        return out

    def _make(self) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """Generate the kernel's call (its makers for a plain and a callable grid)."""
        if self._makers is not None:
            return self._makers
        params = self.params
        kinds = self._kinds()
        fname = self.qualname.rsplit(".", 1)[-1] if self.qualname and _IDENT.match(
            self.qualname.rsplit(".", 1)[-1]) else "kernel"
        self._fname = fname
        heur = set(self.heuristics)
        # the signature: the kernel's own; heuristic parameters, an autotuned kernel's config-set
        # constexprs and every parameter after one with a default get a default (checked below)
        sig: list[str] = []
        defaults: dict[str, Any] = {}
        checked_missing: list[str] = []
        seen_default = False
        for i, p in enumerate(params):
            if p.has_default:
                defaults[f"_khal_d{i}"] = p.default
                sig.append(f"{p.name}=_khal_d{i}")
                seen_default = True
            elif p.name in heur or (self.tuned and p.constexpr):
                sig.append(f"{p.name}=_khal_M")
                seen_default = True
            elif seen_default:
                sig.append(f"{p.name}=_khal_M")
                checked_missing.append(p.name)
            else:
                sig.append(p.name)
        # the options come in ``**_khal_kw`` (the cheapest binding of keywords a call rarely gives: no
        # keyword-only default is looked up when they are not given), as one interned tuple
        head = ", ".join(sig + ["*", "stream=None", "**_khal_kw"])
        allv = "(" + "".join(f"{p.name}, " for p in params) + ")"
        slow = f"return _khal_slow(_khal_grid, {allv}, _khal_o, stream)"
        # the shape: the options' tuple (None: none given), then per constexpr (heuristic ones included)
        # its object, per runtime argument what its kind checks; then the launch function and the branch
        conds = ["_khal_s[0] is _khal_o"]
        layout: list[tuple[str, str]] = [("", "options")]
        for p in params:
            n = p.name
            j = len(layout)
            if p.constexpr:
                conds.append(f"({n} is _khal_s[{j}] or type({n}) is type(_khal_s[{j}]) and {n} == _khal_s[{j}])")
                layout.append((n, "const"))
                continue
            kind, none = kinds[n]
            check = ""
            if kind == "int":
                check = (f"type({n}) is int and _khal_s[{j}] <= {n} <= _khal_s[{j + 1}] and "
                         f"(_khal_s[{j + 2}] or not -2147483648 <= {n} <= 2147483647)")
                layout += [(n, "lo"), (n, "hi"), (n, "disjoint")]
            elif kind == "float":
                check = f"type({n}) is float"
            elif kind == "bool":
                check = f"type({n}) is bool"
            elif kind == "mixed":
                check = f"_khal_tc({n}) == _khal_s[{j}]"
                layout.append((n, "code"))
            if none:
                k = len(layout)
                layout.append((n, "none"))
                conds.append(f"({n} is None) is _khal_s[{k}]" + (f" and ({n} is None or {check})" if check else ""))
            elif check:
                conds.append(check)
        self._layout = layout
        launch_at = len(layout)
        self._shapes[:] = [(_NOMATCH,) * (launch_at + 2)] * SHAPES
        # the branches: the runtime arguments a family takes (those not None), one per set of Nones
        branches = sorted({tuple(n for n in (p.name for p in params if not p.constexpr) if v.types[n] != "none")
                           for v in self._prepare()})
        self._branches = branches
        # (the options of the last call that gave some, compared as a dict: one comparison when they repeat)
        body: list[str] = ["        if _khal_kw:", "            if _khal_kw == (_khal_c := _khal_LAST)[0]:",
                           "                _khal_o = _khal_c[1]", "            else:",
                           "                _khal_o = _khal_opts(_khal_kw)",
                           "        else:", "            _khal_o = None"]
        for n in checked_missing:
            body += [f"        if {n} is _khal_M:", f"            return _khal_need({n!r})"]
        if self.heuristics:
            given = ", ".join(f"{p.name!r}: {p.name}" for p in params)
            body += [f"        _khal_a = {{{given}}}"]
            for n in (p.name for p in params if p.name in heur or (self.tuned and p.constexpr) or
                      p.name in checked_missing):
                body += [f"        if {n} is _khal_M:", f"            del _khal_a[{n!r}]"]
            body += ["        if _khal_o is not None:", "            for _khal_n, _khal_v in zip(_khal_ON, _khal_o):",
                     "                if _khal_v is not None:", "                    _khal_a[_khal_n] = _khal_v"]
            body += ["        for _khal_n, _khal_f in _khal_heur():", "            try:",
                     "                _khal_a[_khal_n] = _khal_f(_khal_a)", "            except KeyError as _khal_e:",
                     "                _khal_hkey(_khal_n, _khal_e)"]
            body += [f"        {n} = _khal_a[{n!r}]" for n in self.heuristics if n in {p.name for p in params}]
        hit = " and ".join(conds)
        for j in range(SHAPES):  # (an empty slot's fields are none of the call's: its first test fails)
            body += [f"        {'if' if j == 0 else 'elif'} {hit.replace('_khal_s[', f'(_khal_s := _khal_S[{j}])[', 1)}:",
                     "            pass"]
        body += ["        else:", f"            {slow}"]
        grid_plain = ["        _khal_g = _khal_grid"]
        if self.tuned:
            meta = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in params) + "}"
            grid_callable = [f"        _khal_m = {meta}",
                             "        _khal_g = lambda _khal_cx: _khal_grid({**_khal_m, **_khal_cx})"]
        else:
            meta = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in params) + "}"
            grid_callable = [f"        _khal_g = _khal_grid({meta})"]
        tail = ["        try:"]
        for b, names in enumerate(branches):
            call = f"_khal_s[{launch_at}](_khal_g, {''.join(f'{n}, ' for n in names)}stream=stream)"
            if len(branches) == 1:
                tail += [f"            return {call}"]
            else:
                tail += [f"            {'if' if b == 0 else 'elif'} _khal_s[{launch_at + 1}] == {b}:",
                         f"                return {call}"]
        tail += ["        except _khal_RETRY:", f"            {slow}"]
        src: list[str] = []
        for maker, grid_lines in (("plain", grid_plain), ("callable_grid", grid_callable)):
            src += [f"def {maker}(_khal_grid):", f"    def {fname}({head}):", *body, *grid_lines, *tail,
                    f"    return {fname}", "", ""]
        ns: dict[str, Any] = {**defaults, "_khal_M": MISSING, "_khal_S": self._shapes, "_khal_slow": self._slow,
                              "_khal_LAST": self._options_last, "_khal_opts": self._options, "_khal_ON": OPTIONS,
                              "_khal_need": self._missing_argument,
                              "_khal_RETRY": (ArgumentError, TritonAssumptionError), "_khal_tc": _type_code,
                              "_khal_heur": self._heuristic_fns, "_khal_hkey": self._heuristic_key}
        self._source = "\n".join(src)
        plain = define(self._source, f"triton kernel {self.name}", ns, "plain")
        callable_grid = ns.pop("callable_grid")
        self._makers = (plain, callable_grid)
        return self._makers

    # -- errors of the call's form -----------------------------------------------------------------

    def _signature_text(self) -> str:
        ps = [f"{p.name}{' (constexpr)' if p.constexpr else ''}" for p in self.params]
        return f"{', '.join(ps)}; options num_warps, num_stages, num_ctas, maxnreg; stream"

    def _options(self, kw: dict[str, Any]) -> tuple[Any, ...]:
        """The options a call's keywords give, (num_warps, num_stages, num_ctas, maxnreg) as given
        (None: not given), one object per value (the generated call compares it by identity); a
        keyword that is not an option is the named error."""
        if not kw.keys() <= _OPTION_SET:
            self._bad_keywords({k: v for k, v in kw.items() if k not in _OPTION_SET})
        raw = tuple(kw.get(o) for o in OPTIONS)
        try:
            if len(_interned) >= 1024:
                _interned.clear()
            raw = _interned.setdefault(raw, raw)
        except TypeError:  # an unhashable value: the slow path names it
            return raw
        self._options_last[:] = [dict(kw), raw]
        return raw

    def _bad_keywords(self, extra: dict[str, Any]) -> None:
        names = ", ".join(repr(k) for k in extra)
        raise ArgumentError(f"{self.name}[grid](): unknown keyword argument(s) {names}; the kernel takes "
                            f"{self._signature_text()} (other compile options are fixed when the package is built)")

    def _missing_argument(self, name: str) -> None:
        raise ArgumentError(f"{self.name}[grid](): missing argument {name!r}; the kernel takes {self._signature_text()}")

    def _heuristic_key(self, name: str, exc: KeyError) -> None:
        """A heuristic read an argument the call does not have: the named error."""
        tuned = (" (a heuristic under @triton.autotune reading a value a config sets is not supported: the "
                 "run time computes the heuristics from the call's own arguments)") if self.tuned else ""
        raise ArgumentError(f"{self.name}[grid](): the kernel's @triton.heuristics for {name} read {exc}, which the call "
                            f"does not give{tuned}; the kernel takes {self._signature_text()}") from None

    def _heuristic_fns(self) -> list[Heuristic]:
        return self._host.heuristics(self.heuristics, self.name)

    # -- the slow path: bind, specialise, choose -----------------------------------------------------

    def _bind(self, values: tuple[Any, ...], options: tuple[Any, ...], heuristics_done: bool = True) -> _Call:
        """The call's constexprs (canonical), options, each runtime argument's JIT specialisation and
        type; its key (what the variants of one family share). ``heuristics_done``: ``values`` hold
        the heuristics' values already (the generated call computes them)."""
        c = _Call()
        c.values = list(values)
        c.raw_options = options
        heur = set(self.heuristics)
        for p, v in zip(self.params, values):
            if v is MISSING and not (p.name in heur or (self.tuned and p.constexpr)):
                self._missing_argument(p.name)
        if self.heuristics and not heuristics_done:
            a = {p.name: v for p, v in zip(self.params, values) if v is not MISSING}
            a.update({o: v for o, v in zip(OPTIONS, options) if v is not None})
            for n, fn in self._heuristic_fns():
                try:
                    a[n] = fn(a)
                except KeyError as exc:
                    self._heuristic_key(n, exc)
            c.values = [a.get(p.name, v) if p.name in heur else v for p, v in zip(self.params, values)]
        if self.tuned:
            given = [o for o, v in zip(OPTIONS, options) if v is not None]
            if given:
                raise ArgumentError(f"{self.name}[grid](): {', '.join(given)} given to an autotuned kernel: its "
                                    "@triton.autotune configs set the options (Triton refuses them too)")
            c.options = None
        else:
            c.options = tuple(d if v is None else _option(o, v, self.name) for o, v, d in
                              zip(OPTIONS, options, OPTION_DEFAULTS))
        kinds = self._kinds()
        cx: list[Any] = []
        tys: list[str] = []
        for i, (p, v) in enumerate(zip(self.params, c.values)):
            if p.constexpr:
                cv = MISSING if v is MISSING else canon(v)
                c.cx[p.name] = cv
                cx.append(cv)
                continue
            kind = kinds[p.name][0]
            if kind in ("int", "fixed", "mixed") and v is not None and not isinstance(v, (int, float)):
                v = c.values[i] = as_index(v)
            if kind == "ptr" and type(v) is int:  # an address (khal's own): any pointer type of the variants
                c.spec[p.name] = ("*", "D" if not v & 15 else None)
                c.types[p.name] = "*"
                c.runtime.append(v)
                tys.append("*")
                continue
            try:
                s = specialize_param(v, p)
            except SpecError as exc:
                raise ArgumentError(f"{self.name}[grid](): argument {p.name!r}: {exc}") from None
            except OverflowError as exc:
                raise ArgumentError(f"{self.name}[grid](): argument {p.name!r}: {exc}") from None
            s = (s[0], s[1] if s[1] == "D" else None)
            if s[0] == "constexpr":
                ty = "none" if s[1] is None and v is None else int_type(int(v))
                s = ("constexpr", None if v is None else 1)
            else:
                ty = _norm_type(str(s[0]))
                s = (ty, s[1])
            c.spec[p.name] = s
            c.types[p.name] = ty
            tys.append(ty)
            if v is not None:
                c.runtime.append(v)
        c.key = (tuple(cx), c.options, tuple(tys))
        return c

    def _family(self, c: _Call) -> TritonKernel | None:
        """The family of the variants with the call's constexprs, options, types and Nones (made at
        the first call of that key), None when no variant has them."""
        if c.key in self._families:
            return self._families[c.key]
        with self._fam_lock:
            match = [v for v in self._prepare() if self._matches(v, c)]
            if match and "*" in c.types.values():  # an address: the first pointer types that match
                first = match[0].types
                match = [v for v in match if v.types == first]
            fam: TritonKernel | None = None
            if match:
                jit_checks = frozenset(
                    [(p.name, "1") for p in self.params if not p.constexpr and not p.do_not_specialize
                     and not p.annotation] +
                    [(p.name, "16") for p in self.params if not p.constexpr and not p.do_not_specialize
                     and not p.do_not_specialize_on_alignment])
                fam = TritonKernel(self.name, self.crate, [v.kernel for v in match], jit_checks=jit_checks)
                fam.jit_specs = {id(v.kernel): v.spec for v in match}  # type: ignore[attr-defined]
            if len(self._families) >= 4096:
                self._families.clear()
            self._families[c.key] = fam
        return fam

    def _matches(self, v: _Variant, c: _Call) -> bool:
        for name, cv in c.cx.items():
            if cv is not MISSING and v.cx.get(name, _NOMATCH) != cv:
                return False
        if c.options is not None and v.options != c.options:
            return False
        for name, ty in c.types.items():
            vt = v.types.get(name)
            if vt != ty and not (ty == "*" and vt is not None and vt.startswith("*")):
                return False
        return True

    def _fits(self, fam: TritonKernel, c: _Call) -> bool:
        """Whether some variant of ``fam`` takes the call's values (their assumptions hold)."""
        values = fam._values(tuple(c.runtime))
        bits = fam._bits(values)
        return any(mask & bits == mask for mask, _ in fam._masks)

    def _slow(self, grid: Any, values: tuple[Any, ...], options: tuple[Any, ...] | None, stream: Any) -> None:
        c = self._bind(values, options or _NO_OPTIONS)
        fam = self._family(c)
        if fam is None or not self._fits(fam, c):
            return self._not_built(grid, c, fam, stream)
        g = self._grid(grid, c)
        if not _STATS_ON:
            self._remember(c, fam)
        fam.launch(g, *c.runtime, stream=stream)
        if _STATS_ON:
            self._count(fam, c)

    def _warmup(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        kwargs.pop("stream", None)
        self._resolve("warmup()", args, kwargs)[1]._ensure_fast()

    def _resolve(self, who: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Call, TritonKernel]:
        """A call given as ``k[grid]`` takes it (``kwargs``: its keywords and options, no ``stream``),
        bound: (the call, the family whose variant takes it); the call's named error when none does."""
        names = [p.name for p in self.params]
        opts = tuple(kwargs.pop(o, None) for o in OPTIONS)
        if len(args) > len(names):
            raise ArgumentError(f"{self.name}.{who}: {len(args)} positional arguments for {len(names)} parameters "
                                f"({self._signature_text()})")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                self._bad_keywords({k: v})
            if k in bound:
                raise ArgumentError(f"{self.name}.{who}: argument {k!r} given twice (positionally and by keyword)")
            bound[k] = v
        values = tuple(bound.get(p.name, p.default if p.has_default else MISSING) for p in self.params)
        c = self._bind(values, opts, heuristics_done=False)
        fam = self._family(c)
        if fam is None or not self._fits(fam, c):
            raise self._missing_error(c, fam)
        return c, fam

    def _grid(self, grid: Any, c: _Call) -> Any:
        t = type(grid)
        if t is int or t is tuple or not callable(grid):
            return grid
        meta = {p.name: v for p, v in zip(self.params, c.values)}
        if self.tuned:
            return lambda cx: grid({**meta, **cx})
        return grid(meta)

    def _remember(self, c: _Call, fam: TritonKernel) -> None:
        """Remember the call's shape (what the generated call checks, :meth:`_make`) with its family."""
        if self._makers is None:
            return
        launch = fam._ensure_fast() or fam.launch
        shape: list[Any] = []
        for name, what in self._layout:
            i = self._index(name)
            v = c.values[i] if what != "options" else None
            if what == "options":
                shape.append(None if c.raw_options is _NO_OPTIONS else c.raw_options)
            elif what == "const":
                shape.append(v)
            elif what == "none":
                shape.append(v is None)
            elif what == "code":
                shape.append(_type_code(v))
            else:
                ty = c.types[name]
                lo, hi, disjoint = _INT_RANGES.get(ty, (1, 0, True)) if ty != "none" else (1, 0, True)
                shape.append(lo if what == "lo" else hi if what == "hi" else disjoint)
        names = tuple(n for n in (p.name for p in self.params if not p.constexpr) if c.types[n] != "none")
        shape += [launch, self._branches.index(names) if names in self._branches else -1]
        if shape[-1] < 0:
            return
        shapes = self._shapes
        shapes[:] = [tuple(shape), *shapes[:SHAPES - 1]]

    def _index(self, name: str) -> int:
        for i, p in enumerate(self.params):
            if p.name == name:
                return i
        return -1

    def _count(self, fam: TritonKernel, c: _Call) -> None:
        """KHAL_TRITON_STATS: whether the variant launched had exactly the JIT's specialisation."""
        try:
            variant = fam._known_choice(tuple(c.runtime), "stats")[1][2]
        except KhalError:
            return
        vspec = fam.jit_specs.get(id(variant))
        cspec = tuple(c.spec[p.name] for p in self.params if not p.constexpr)
        exact = vspec is not None and all(a == b or (b[0] == "*" and a[0].startswith("*") and a[1] == b[1])
                                          for a, b in zip(vspec, cspec))
        _count(self._stats_key, 0 if exact else 1)

    # -- no variant covers the call ------------------------------------------------------------------

    def _fallback_on(self) -> bool:
        raw = os.environ.get(FALLBACK_VAR)
        if raw is not None and raw.strip():
            return env_flag(raw, FALLBACK_VAR)
        t = getattr(self._ck.crate, "triton", None)
        return bool(getattr(t, "jit_fallback", False))

    def _not_built(self, grid: Any, c: _Call, fam: TritonKernel | None, stream: Any) -> None:
        if not self._fallback_on():
            raise self._missing_error(c, fam)
        jit = self._host.jit()
        if jit is None:
            raise self._missing_error(c, fam, note=(
                f"The JIT fallback is on ({FALLBACK_VAR} or the crate's jit-fallback), but Triton or the kernel's "
                f"module ({self.module or 'none recorded'}) cannot be imported here."))
        if stream is not None:
            raise self._missing_error(c, fam, note=(
                "The JIT fallback launches on PyTorch's current stream, as Triton does: call it without stream= "
                "(inside `with torch.cuda.stream(s):`)."))
        if c.key not in self._jitted:
            self._jitted.add(c.key)
            path = append_record("".join(self._lock_tables(c)))
            warnings.warn(f"{self.crate}.{self.name}: no built variant covers {self._call_text(c)}; Triton's JIT "
                          f"compiles it (recorded in {path} for the next build)", TritonJitFallbackWarning, stacklevel=4)
        heur = set(self.heuristics)
        kwargs = {p.name: v for p, v in zip(self.params, c.values) if v is not MISSING and p.name not in heur}
        kwargs.update({o: v for o, v in zip(OPTIONS, c.raw_options) if v is not None})
        g = (grid,) if type(grid) is int else grid
        jit[g](**kwargs)
        if _STATS_ON:
            _count(self._stats_key, 2)

    def _call_text(self, c: _Call) -> str:
        parts = []
        for p in self.params:
            if p.constexpr:
                cv = c.cx.get(p.name, MISSING)
                parts.append(f"{p.name}=" + ("(config)" if cv is MISSING else show(cv)))
            else:
                s = c.spec[p.name]
                parts.append(f"{p.name}=None" if s == ("constexpr", None) else
                             f"{p.name}: {spelling(s, c.types[p.name]) if s[0] != '*' else '*?'}")
        if c.options is not None:
            parts.append(f"num_warps={c.options[0]}, num_stages={c.options[1]}")
            if c.options[2] != 1:
                parts.append(f"num_ctas={c.options[2]}")
            if c.options[3] is not None:
                parts.append(f"maxnreg={c.options[3]}")
        return f"{self.name}({', '.join(parts)})"

    def _lock_tables(self, c: _Call) -> list[str]:
        """The lock-file tables that would build the call's variant (one per config of an autotuned kernel)."""
        args = {}
        for p in self.params:
            if p.constexpr:
                continue
            s = c.spec[p.name]
            if s[0] == "*":  # an address: the pointer type of a variant, else a placeholder
                ty = next((v.types[p.name] for v in self._prepare() if v.types[p.name].startswith("*")), "*i8")
                s = (ty, s[1])
            args[p.name] = spelling(s, c.types[p.name] if c.types[p.name] in _INT_RANGES else "i32")
        cx = {n: uncanon(v) for n, v in c.cx.items() if v is not MISSING}
        companion = getattr(getattr(self._ck.crate, "triton", None), "serves", None) is not None
        module = self.module if companion else None
        kernel = self.qualname or self.name
        if not self.tuned:
            return [lock_table(self.crate, kernel, args, cx, c.options, module=module)]
        out = []
        configs: dict[int, _Variant] = {}
        for v in self._prepare():
            if v.config is not None:
                configs.setdefault(v.config, v)
        for j, v in sorted(configs.items()):
            own = {n: uncanon(x) for n, x in v.cx.items() if c.cx.get(n) is MISSING}
            out.append(lock_table(self.crate, kernel, args, {**cx, **own}, v.options, module=module, config=j))
        return out

    def _missing_error(self, c: _Call, fam: TritonKernel | None, note: str = "") -> TritonMissingVariantError:
        vs = self._prepare()

        def diff(v: _Variant) -> list[str]:
            out = [n for n, cv in c.cx.items() if cv is not MISSING and v.cx.get(n, _NOMATCH) != cv]
            if c.options is not None:
                out += [o for o, a, b in zip(OPTIONS, v.options, c.options) if a != b]
            out += [n for n, ty in c.types.items()
                    if v.types.get(n) != ty and not (ty == "*" and (v.types.get(n) or "").startswith("*"))]
            return out

        ranked = sorted(vs, key=lambda v: (len(diff(v)), v.name))[:3]
        lines = [f"{self.crate}.{self.name}: no built variant covers the call {self._call_text(c)}."]
        if fam is not None:
            lines.append("Variants of these constexprs, options and types are built, but each assumes what the call "
                         "breaks (a 16-byte aligned pointer, an integer divisible by 16 or equal to 1):")
            for k in fam.variants[:3]:
                v = next(x for x in vs if x.kernel is k)
                lines.append(f"  {v.describe(self.params)}")
        elif ranked:
            lines.append("The nearest built variants:")
            for v in ranked:
                d = diff(v)
                lines.append(f"  {v.describe(self.params)}" + (f"  -- differs in {', '.join(d)}" if d else ""))
        lines.append("To build it, add to the project's khal-triton.lock:")
        lines += ["  " + ln for t in self._lock_tables(c) for ln in t.rstrip().splitlines()]
        lines.append("or record it from a run: python -m hatch_khal triton record -- <your command>")
        if note:
            lines.append(note)
        elif not self._fallback_on():
            lines.append(f"(or let such calls go to Triton's JIT where it is installed: the crate's jit-fallback, or "
                         f"{FALLBACK_VAR}=1)")
        return TritonMissingVariantError("\n".join(lines))


class TritonFunctionBound:
    """A kernel's own call bound to its arguments (:meth:`TritonFunction.bind`): ``b(grid)`` launches
    the chosen variant; a callable grid is given the call's meta dict, as ``k[grid](...)`` gives it."""

    __slots__ = ("bound", "function", "call")

    def __init__(self, bound: Any, function: TritonFunction, call: _Call) -> None:
        #: the family's bound launch (:class:`~khal_runtime.triton.TritonBound`)
        self.bound = bound
        self.function = function
        self.call = call

    def __call__(self, grid: Any) -> None:
        self.bound(self.function._grid(grid, self.call))

    def __reduce__(self) -> Any:
        raise TypeError("a bound Triton call cannot be pickled: it holds device pointers; bind again")

    def __repr__(self) -> str:
        return f"<TritonFunctionBound {self.bound!r}>"


def _option(name: str, v: Any, who: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            v = as_index(v)
        except Exception:  # noqa: BLE001 - reported below
            pass
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ArgumentError(f"{who}[grid](): {name}={v!r} is not a positive integer")
    return int(v)


def _type_code(v: Any) -> str:
    """The type the JIT gives a value (for a parameter whose variants differ in kind)."""
    if v is None:
        return "none"
    if type(v) is bool:
        return "u1"
    if isinstance(v, int):
        return int_type(int(v)) if -(1 << 63) <= v < (1 << 64) else "?"
    if isinstance(v, float):
        return "fp32"
    try:
        return pointer_type(getattr(v, "dtype", None))
    except SpecError:
        return "?"


def group_functions(kernels: Iterable[Any]) -> dict[str, list[Any]]:
    """The entries of a Triton crate by kernel (``TritonFacts.qualname``, else ``kernel``), those
    recording the kernel's signature (``params``)."""
    out: dict[str, list[Any]] = {}
    for k in kernels:
        t = k.entry.triton
        if t is not None and t.params:
            out.setdefault(t.qualname or t.kernel, []).append(k)
    return out
