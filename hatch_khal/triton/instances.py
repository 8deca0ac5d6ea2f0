"""A Triton crate's instances: what the crate's ``instances`` tables declare, checked and expanded,
and the variants of the lock file made instances of the same shape (:func:`lock_instance`).

Each table names one ``@triton.jit`` kernel and its signature in Triton's own spelling, in the
kernel's argument order::

    [[tool.hatch.build.hooks.khal.crates.instances]]
    kernel = "add_kernel"
    name = "add_{T}"                       # optional: the entry's name ({KEY} from the matrix)
    signature = { x_ptr = "*{T}:16", y_ptr = "*{T}:16", out_ptr = "*{T}:16", n_elements = "i32:16",
                  BLOCK_SIZE = 1024 }
    matrix = { T = ["fp32", "fp16"] }      # one instance per combination; or a list of tables
                                           # (values that vary together): [{ T = "fp32", W = 4 }, ...]
    num_warps = 4                          # or "{W}", from the matrix
    num_stages = 3
    num_ctas = 1                           # optional, sm_90+: each program a cluster of this many CTAs
    maxnreg = 128                          # optional: Triton's register cap per thread

A runtime argument's value is a type (``*fp32``: a pointer to fp32; ``i32``, ``i64``, ``u64``,
``fp32``, ``u1`` (a bool); ``:16`` after it: the binary may assume the pointer 16-byte aligned, the
integer divisible by 16; ``:1`` after an integer: the binary assumes it is 1, compiled in, as
Triton's JIT does for unit strides; ``none``: the call passes None, compiled as constexpr None). A
``tl.constexpr`` parameter's value is an int, float, bool, string (one that reads as a number or
bool is that number or bool), ``{ dtype = "fp32" }`` (a ``tl.dtype``, by ``tl.dtype.name``),
``{ none = true }`` or ``{ str = "..." }`` (a string as written). Which parameters are constexprs
is the kernel's own word (Triton's ``is_constexpr``): :func:`fit` checks each instance against
the kernel's parameters once the worker has read them, and refuses a type for a constexpr (the
old ``X_dtype = "fp32"``) or a value for a runtime argument, saying what to write.

An instance with ``:16`` / ``:1`` assumptions is built twice: as written, and as a conservative
``<name>__base`` entry without them (``fallback = false`` leaves it out), so that a call that
breaks an assumption still runs. Its constexprs, those a ``@triton.heuristics`` computes included,
are the same in both: the manifest records which constexprs the heuristics compute
(``TritonFacts.heuristics``) so that the runtime can refuse a call whose heuristic value differs.

``autotune = true`` (a kernel under ``@triton.autotune``): the worker builds one variant per
``triton.Config`` (the signature leaves out the constexprs the configs set); ``choose`` is the
author's rule for the config (``"time"``: timed at run time, ``"first"``, an index).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn, Sequence

from khal_runtime.manifest import ConstValue, TritonDtype, TritonParam

from hatch_khal.errors import ConfigError

if TYPE_CHECKING:
    from hatch_khal.triton.lock import LockVariant

__all__ = ["DTYPE_NAMES", "POINTEE_TYPES", "SCALAR_TYPES", "TritonArg", "TritonInstance", "fit", "lock_instance",
           "parse_instances", "parse_type", "value_from_json", "value_json", "with_config"]

#: Triton scalar type -> khal scalar name (``khal_runtime.abi.SCALARS``); ``u1`` is the JIT's bool
SCALAR_TYPES = {"i1": "bool", "u1": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
                "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
                "fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}
#: what a pointer may point at (the scalars, and Triton's fp8 kinds)
POINTEE_TYPES = {**SCALAR_TYPES, "fp8e4nv": "uint8", "fp8e5": "uint8", "fp8e4b15": "uint8", "fp8e4b8": "uint8",
                 "fp8e5b16": "uint8"}
#: scalar kernel arguments passed by value (Triton's by-value types)
BY_VALUE = {"i1", "u1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64"}
#: the integer types Triton's JIT specialises (``:16``, ``:1``)
_SPECIALISED = ("i32", "i64", "u32", "u64")
#: ``tl.dtype.name`` of every Triton dtype (``{ dtype = "fp32" }``)
DTYPE_NAMES = ("int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "fp8e4b15", "fp8e4nv",
               "fp8e4b8", "fp8e5", "fp8e5b16", "fp16", "bf16", "fp32", "fp64", "void")
#: names people reach for -> Triton's
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
                  "float64": "fp64", "double": "fp64", "bool": "int1", "i1": "int1", "u1": "int1", "i8": "int8",
                  "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
                  "u64": "uint64"}
_TYPE = re.compile(r"^(\*?)([a-z0-9]+)(?::(\d+))?$")
_KEYS = {"kernel", "name", "signature", "matrix", "num_warps", "num_stages", "num_ctas", "maxnreg", "fallback",
         "autotune", "choose"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_WHOLE_PLACEHOLDER = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def value_json(value: ConstValue) -> Any:
    """A constexpr's value in JSON (hashes, the worker's request and answer): a dtype as ``{"dtype": name}``."""
    return {"dtype": value.dtype} if isinstance(value, TritonDtype) else value


def value_from_json(raw: Any) -> ConstValue:
    """The inverse of :func:`value_json`."""
    if isinstance(raw, dict):
        return TritonDtype(dtype=raw["dtype"])
    assert raw is None or isinstance(raw, (bool, int, float, str))
    return raw


@dataclass(frozen=True)
class TritonArg:
    name: str
    #: a runtime argument: its Triton type ("*fp32", "i32"); a constexpr or a None argument: None
    type: str | None
    #: the constexpr's value
    value: ConstValue = None
    #: the binary assumes 16-byte alignment (a pointer) or divisibility by 16 (an integer)
    divisible: bool = False
    #: the binary assumes the integer is 1 (``i32:1``, Triton's specialisation of unit strides): it is
    #: compiled in as a constexpr and is not a parameter of that binary
    one: bool = False
    #: a runtime argument the call passes None (``none``): compiled as constexpr None, as Triton's JIT
    #: does, so not a parameter of the binary
    none: bool = False

    @property
    def pointer(self) -> bool:
        return self.type is not None and self.type.startswith("*")

    @property
    def constexpr(self) -> bool:
        """A constexpr parameter's value (not a runtime argument, not a None argument)."""
        return self.type is None and not self.none

    def spelling(self) -> str:
        """How the signature spells it."""
        if self.none:
            return "none"
        if self.type is None:
            return repr(value_json(self.value))
        return self.type + (":16" if self.divisible else ":1" if self.one else "")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "value": value_json(self.value), "divisible": self.divisible,
                "one": self.one, "none": self.none}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TritonArg:
        return cls(raw["name"], raw["type"], value_from_json(raw["value"]), bool(raw["divisible"]), bool(raw["one"]),
                   bool(raw["none"]))


@dataclass(frozen=True)
class TritonInstance:
    """One entry to build: a kernel, its full signature (every argument), its options."""

    name: str
    kernel: str
    args: tuple[TritonArg, ...]
    num_warps: int
    num_stages: int
    #: the name of the entry it specialises (None: it is the as-written instance); the runtime picks
    #: the most specialised entry of a family whose assumptions hold
    family: str = ""
    #: this is the conservative twin (no ``:16`` assumptions) of ``family``
    base: bool = False
    #: build one variant per ``triton.Config`` of the kernel's ``@triton.autotune`` (option ``autotune``)
    autotune: bool = False
    #: the author's rule for the config (option ``choose``): its index; None: timed on first use per key
    choose: int | None = None
    #: CTAs per program (option ``num_ctas``, sm_90+): each program a thread-block cluster of that many
    num_ctas: int = 1
    #: Triton's ``maxnreg`` (registers per thread), None: not set
    maxnreg: int | None = None
    #: a variant of the lock file (``python -m hatch_khal triton record``)
    recorded: bool = False
    #: the module the kernel is looked up in (a lock variant's ``module``: a companion crate's);
    #: None: the one source of the crate that defines it
    module: str | None = None
    #: how errors name it ("" for an instance table: ``instance '<name>'``; a lock variant: the file,
    #: its index and its entry)
    origin: str = ""
    #: the index of the ``@triton.autotune`` config a lock variant ran (its kwargs among the constexprs)
    config: int | None = None

    @property
    def where(self) -> str:
        return self.origin or f"instance {self.name!r}"

    @property
    def runtime_args(self) -> tuple[TritonArg, ...]:
        return tuple(a for a in self.args if a.type is not None)

    def triton_signature(self) -> dict[str, str]:
        """What Triton compiles: a constexpr for each constexpr, each argument assumed 1 and each None."""
        return {a.name: a.type if a.type is not None and not a.one else "constexpr" for a in self.args}

    def constexprs(self) -> dict[str, ConstValue]:
        """The kernel's own constexprs (not the arguments assumed 1, not the None arguments)."""
        return {a.name: a.value for a in self.args if a.constexpr}

    def nones(self) -> list[str]:
        """The runtime arguments passed None (compiled as constexpr None)."""
        return [a.name for a in self.args if a.none]

    def compile_constexprs(self) -> dict[str, ConstValue]:
        """What Triton gets as constants: the constexprs, the arguments assumed 1 and the None arguments."""
        return {**self.constexprs(), **{a.name: 1 for a in self.args if a.one},
                **{a.name: None for a in self.args if a.none}}

    def divisible(self) -> list[str]:
        return [a.name for a in self.args if a.divisible]

    def ones(self) -> list[str]:
        return [a.name for a in self.args if a.one]

    def record(self) -> dict[str, Any]:
        """What the entry hash covers of the instance (the newer options only when given: an
        instance without them hashes as before they existed)."""
        out: dict[str, Any] = {"kernel": self.kernel, "signature": self.triton_signature(),
                               "constexprs": {k: value_json(v) for k, v in self.constexprs().items()},
                               "divisible": self.divisible(), "ones": self.ones(),
                               "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.autotune:
            out["autotune"] = True
            out["choose"] = self.choose
        if self.num_ctas != 1:
            out["num_ctas"] = self.num_ctas
        if self.nones():
            out["nones"] = self.nones()
        if self.maxnreg is not None:
            out["maxnreg"] = self.maxnreg
        if self.recorded:
            out["recorded"] = True
        if self.module is not None:
            out["module"] = self.module
        if self.config is not None:
            out["config"] = self.config
        return out

    def to_json(self) -> dict[str, Any]:
        """The instance as the worker's request carries it (:meth:`from_json`)."""
        return {"name": self.name, "kernel": self.kernel, "args": [a.to_json() for a in self.args],
                "num_warps": self.num_warps, "num_stages": self.num_stages, "family": self.family, "base": self.base,
                "autotune": self.autotune, "choose": self.choose, "num_ctas": self.num_ctas, "maxnreg": self.maxnreg,
                "recorded": self.recorded, "module": self.module, "origin": self.origin, "config": self.config}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TritonInstance:
        return cls(name=raw["name"], kernel=raw["kernel"], args=tuple(TritonArg.from_json(a) for a in raw["args"]),
                   num_warps=raw["num_warps"], num_stages=raw["num_stages"], family=raw["family"], base=raw["base"],
                   autotune=raw["autotune"], choose=raw["choose"], num_ctas=raw["num_ctas"], maxnreg=raw["maxnreg"],
                   recorded=raw["recorded"], module=raw["module"], origin=raw["origin"], config=raw["config"])


def _literal(text: str) -> int | float | bool | None:
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _type_arg(where: str, name: str, text: str) -> TritonArg | None:
    """``text`` as a runtime argument's spelling (``*fp32:16``, ``i32``, ``none``), None when it reads
    as no type (a word, a number); ConfigError for a malformed one."""
    if text == "none":
        return TritonArg(name, None, None, none=True)
    m = _TYPE.match(text)
    if m is None:
        return None
    star, base, spec = m.groups()
    if not star and spec is None and base not in BY_VALUE:
        return None
    table = POINTEE_TYPES if star else BY_VALUE
    if base not in table:
        raise ConfigError(f"{where}: {base!r} in {text!r} is not a Triton {'pointee' if star else 'scalar'} type "
                          f"(one of {', '.join(sorted(table))})")
    if spec is not None:
        if spec not in ("16", "1"):
            raise ConfigError(f"{where}: ':{spec}' in {text!r} is not a specialisation Triton makes (':16': 16-byte "
                              "aligned pointer / integer divisible by 16; ':1': an integer equal to 1)")
        if spec == "1" and (star or base not in _SPECIALISED):
            raise ConfigError(f"{where}: ':1' in {text!r} applies to integers only ({', '.join(_SPECIALISED)})")
        if not star and base not in _SPECIALISED:
            raise ConfigError(f"{where}: ':16' in {text!r} applies to pointers and integers only "
                              f"({', '.join(_SPECIALISED)})")
    return TritonArg(name, star + base, None, spec == "16", spec == "1")


def parse_type(where: str, text: str, name: str = "") -> TritonArg:
    """A runtime argument's spelling (``*fp32:16``, ``i32:1``, ``u1``, ``none``) as its :class:`TritonArg`;
    ConfigError naming ``where`` for anything else."""
    got = _type_arg(where, name, text)
    if got is None:
        raise ConfigError(f"{where}: {text!r} is not a runtime argument's type ('*fp32', '*fp16:16', 'i32', "
                          "'i32:16', 'i32:1', 'i64', 'u64', 'fp32', 'u1', 'none')")
    return got


def _dtype(where: str, name: Any) -> TritonDtype:
    if not isinstance(name, str) or name not in DTYPE_NAMES:
        hint = f" (Triton calls it {_DTYPE_ALIASES[name]!r})" if isinstance(name, str) and name in _DTYPE_ALIASES else ""
        raise ConfigError(f"{where}: {{ dtype = {name!r} }} is not a Triton dtype{hint}; one of "
                          f"{', '.join(DTYPE_NAMES)} (tl.dtype.name)")
    return TritonDtype(dtype=name)


def _table_arg(where: str, name: str, raw: Mapping[str, Any]) -> TritonArg:
    if set(raw) == {"dtype"}:
        return TritonArg(name, None, _dtype(where, raw["dtype"]))
    if set(raw) == {"none"} and raw["none"] is True:
        return TritonArg(name, None, None, none=True)
    if set(raw) == {"str"} and isinstance(raw["str"], str):
        return TritonArg(name, None, raw["str"])
    raise ConfigError(f"{where}: {dict(raw)!r} is not a constexpr value: a table is {{ dtype = \"fp32\" }} (a "
                      "tl.dtype), { none = true } or { str = \"...\" } (a string as written)")


def _arg(where: str, name: str, raw: Any) -> TritonArg:
    here = f"{where}: signature field {name!r}"
    if isinstance(raw, bool) or isinstance(raw, (int, float)):
        return TritonArg(name, None, raw)
    if isinstance(raw, dict):
        return _table_arg(here, name, raw)
    if not isinstance(raw, str):
        raise ConfigError(f"{here}: {raw!r} is neither a Triton type ('*fp32', 'i32', '*fp32:16', 'none') nor a "
                          "constexpr value (an int, float, bool, string, { dtype = \"fp32\" }, { none = true })")
    got = _type_arg(here, name, raw.strip())
    if got is not None:
        return got
    value = _literal(raw.strip())
    return TritonArg(name, None, raw if value is None else value)


def _fill(where: str, text: str, combo: Mapping[str, Any]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in combo:
            raise ConfigError(f"{where}: {text!r} names {{{m.group(1)}}}, which the instance's 'matrix' does not "
                              f"give (it gives: {', '.join(combo) or 'nothing'})")
        return str(combo[m.group(1)])

    return _PLACEHOLDER.sub(sub, text)


def _fill_value(where: str, raw: Any, combo: Mapping[str, Any]) -> Any:
    """A signature value with the matrix applied: ``{KEY}`` in a string (and in a table's strings:
    ``{ dtype = "{T}" }``) takes its value."""
    if isinstance(raw, str):
        return _fill(where, raw, combo)
    if isinstance(raw, dict):
        return {k: _fill_value(where, v, combo) for k, v in raw.items()}
    return raw


def _positive(where: str, key: str, raw: Any, default: int, power_of_two: bool, combo: Mapping[str, Any],
              high: int = 32) -> int:
    if raw is None:
        return default
    if isinstance(raw, str) and _WHOLE_PLACEHOLDER.match(raw.strip()):
        filled = _fill(f"{where}: option {key!r}", raw.strip(), combo)
        value = _literal(filled)
        raw = value if isinstance(value, int) and not isinstance(value, bool) else filled
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1 or raw > high or \
            (power_of_two and raw & (raw - 1)):
        what = f"a power of two from 1 to {high}" if power_of_two else f"an integer from 1 to {high}"
        if key == "num_ctas":
            what = ("1, 2, 4 or 8 (the CTAs of a program's thread-block cluster, sm_90+; 16 is not portable)")
        raise ConfigError(f"{where}: option {key!r} is {raw!r}, not {what} (or \"{{KEY}}\", from the matrix)")
    return raw


def _choose(where: str, table: Mapping[str, Any], autotune: bool) -> int | None:
    """Option ``choose``: the config an autotuned instance launches, by the author's rule
    (``"time"``, the default: timed on the user's GPU at first use per key; ``"first"``: config 0;
    an index), or None for timing."""
    raw = table.get("choose")
    if raw is None:
        return None
    if not autotune:
        raise ConfigError(f"{where}: option 'choose' picks one of the kernel's @triton.autotune configs: it needs "
                          "autotune = true")
    if raw == "time":
        return None
    if raw == "first":
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ConfigError(f"{where}: option 'choose' is {raw!r}, not \"time\" (timed on the GPU at first use), "
                          "\"first\" or the index of a config (0, 1, ...)")
    return raw


def _combos(where: str, matrix: Any) -> list[dict[str, Any]]:
    """The matrix's combinations: a table of lists (their product) or a list of tables (each one
    combination: values that vary together)."""
    scalar = (str, int, float, bool)
    if isinstance(matrix, list):
        if not matrix or any(not isinstance(t, dict) or not t or
                             any(not _NAME.match(k) or not isinstance(v, scalar) for k, v in t.items())
                             for t in matrix):
            raise ConfigError(f"{where}: option 'matrix' as a list must hold non-empty tables of strings, numbers and "
                              "bools, one per instance ([{ T = \"fp32\", B = 1024 }, { T = \"fp16\", B = 2048 }])")
        return [dict(t) for t in matrix]
    if not isinstance(matrix, dict) or any(not isinstance(v, list) or not v or
                                           any(not isinstance(x, scalar) for x in v) for v in matrix.values()):
        raise ConfigError(f"{where}: option 'matrix' must be a table of non-empty lists ({{ T = [\"fp32\", "
                          "\"fp16\"] }}: one instance per combination) or a list of tables ([{ T = \"fp32\", "
                          "B = 1024 }, ...]: one instance per table)")
    keys = list(matrix)
    return [dict(zip(keys, values)) for values in itertools.product(*(matrix[k] for k in keys))]


def parse_instances(crate: str, raw: Any) -> list[TritonInstance]:
    """The crate's instances, matrices expanded, each with its conservative twin. ConfigError naming
    the crate, the instance and the field for anything it cannot build. Which signature values are
    constexprs is settled against the kernel later (:func:`fit`)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"crate {crate!r}: option 'instances' must be a list of tables, each naming a @triton.jit "
                          "kernel and its signature (see docs/guide/triton.md)")
    out: list[TritonInstance] = []
    seen: dict[str, str] = {}
    for i, table in enumerate(raw):
        where = f"crate {crate!r}: instances[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: is {table!r}, not a table")
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))} (an instance takes "
                              f"{', '.join(sorted(_KEYS))})")
        kernel = table.get("kernel")
        if not isinstance(kernel, str) or not _NAME.match(kernel):
            raise ConfigError(f"{where}: option 'kernel' must name a @triton.jit function (got {kernel!r})")
        where = f"crate {crate!r}: instances[{i}] ({kernel})"
        sig = table.get("signature")
        if not isinstance(sig, dict) or not sig:
            raise ConfigError(f"{where}: option 'signature' must be a table of the kernel's arguments in order "
                              "({ x_ptr = \"*fp32:16\", n = \"i32\", BLOCK_SIZE = 1024 })")
        combos = _combos(where, table.get("matrix", {}))
        fallback = table.get("fallback", True)
        if not isinstance(fallback, bool):
            raise ConfigError(f"{where}: option 'fallback' must be true or false (got {fallback!r})")
        autotune = table.get("autotune", False)
        if not isinstance(autotune, bool):
            raise ConfigError(f"{where}: option 'autotune' must be true or false (got {autotune!r})")
        choose = _choose(where, table, autotune)
        for combo in combos:
            label = ", ".join(f"{k}={v}" for k, v in combo.items())
            here = f"{where}" + (f" [{label}]" if label else "")
            warps = _positive(here, "num_warps", table.get("num_warps"), 4, True, combo)
            stages = _positive(here, "num_stages", table.get("num_stages"), 3, False, combo)
            ctas = _positive(here, "num_ctas", table.get("num_ctas"), 1, True, combo, high=8)
            maxnreg = table.get("maxnreg")
            if maxnreg is not None:
                maxnreg = _positive(here, "maxnreg", maxnreg, 0, False, combo, high=255)
            raw_name = table.get("name")
            if raw_name is None:
                name = "_".join([kernel, *(re.sub(r"\W", "_", str(v)) for v in combo.values())])
            elif isinstance(raw_name, str):
                name = _fill(f"{here}: option 'name'", raw_name, combo)
            else:
                raise ConfigError(f"{here}: option 'name' must be a string (got {raw_name!r})")
            if not _NAME.match(name) or "__" in name:
                raise ConfigError(f"{here}: entry name {name!r} is not an identifier without '__' (option 'name')")
            args = [_arg(here, arg, _fill_value(f"{here}: signature field {arg!r}", value, combo))
                    for arg, value in sig.items()]
            for name_ in (name, f"{name}__base"):
                if name_ in seen:
                    raise ConfigError(f"{here}: entry name {name_!r} is also the name of {seen[name_]}; give the "
                                      "instances distinct names (option 'name', with {KEY} from the matrix)")
                seen[name_] = here
            inst = TritonInstance(name, kernel, tuple(args), warps, stages, family=name, autotune=autotune,
                                  choose=choose, num_ctas=ctas, maxnreg=maxnreg)
            out.append(inst)
            if fallback and any(a.divisible or a.one for a in args):
                plain = tuple(TritonArg(a.name, a.type, a.value, none=a.none) for a in args)
                out.append(replace(inst, name=f"{name}__base", args=plain, base=True))
    return out


def lock_instance(variant: LockVariant, name: str, origin: str) -> TritonInstance:
    """A lock file's variant as an instance named ``name`` (:func:`hatch_khal.triton.lock.entry_name`):
    its arguments and constexprs in the lock's order (:func:`fit` puts them in the kernel's), a
    family of its own, no twin."""
    args = [parse_type(f"{origin}: field 'args.{n}'", s, n) for n, s in variant.args.items()]
    args += [TritonArg(n, None, v) for n, v in variant.constexprs.items()]
    return TritonInstance(name, variant.kernel, tuple(args), variant.num_warps, variant.num_stages, family=name,
                          num_ctas=variant.num_ctas, maxnreg=variant.maxnreg, recorded=True, module=variant.module,
                          origin=origin, config=variant.config)


def with_config(inst: TritonInstance, arg_names: Sequence[str], index: int, kwargs: Mapping[str, ConstValue],
                num_warps: int, num_stages: int, num_ctas: int, maxnreg: int | None) -> TritonInstance:
    """The variant of an ``autotune`` instance for config ``index`` of the kernel's autotuner: the
    config's kwargs among its constexprs (in the kernel's order), its warps, stages, CTAs and maxnreg."""
    given = {a.name: a for a in inst.args}
    args = tuple(given[n] if n in given else TritonArg(n, None, kwargs[n]) for n in arg_names
                 if n in given or n in kwargs)
    return replace(inst, name=f"{inst.name}__c{index}", args=args, num_warps=num_warps, num_stages=num_stages,
                   num_ctas=num_ctas, maxnreg=maxnreg)


def _annotated(annotation: str, type_: str) -> bool:
    """Whether a runtime argument of ``type_`` is what the parameter's annotation forces."""
    canon = {"i1": "u1", "*i1": "*u1"}
    annotation = annotation.replace("*k", "*")
    return canon.get(annotation, annotation) == canon.get(type_, type_)


def fit(inst: TritonInstance, params: Sequence[TritonParam]) -> TritonInstance:
    """``inst`` checked against the kernel's parameters (Triton's ``JITFunction.params``: which are
    constexprs is the kernel's word, never the spelling of a value) and put in their order: a
    ``tl.constexpr`` takes a value, a runtime argument a type (or ``none``); a None given either
    way is compiled as constexpr None (a None argument of a runtime parameter); a parameter an
    instance table leaves out takes its default when that is a constexpr's or None. A lock
    variant must name every parameter. ConfigError naming the instance (a lock variant: the lock
    file, the entry and the kernel) for anything else."""
    names = [p.name for p in params]
    given = {a.name: a for a in inst.args}
    kernel = inst.kernel

    def fail(detail: str) -> NoReturn:
        if inst.recorded:
            raise ConfigError(f"{inst.where} no longer fits kernel {kernel!r}: {detail}; record it again (python -m "
                              "hatch_khal triton record -- ...) or delete the variant from the lock file")
        raise ConfigError(f"{inst.where}: {detail}")

    extra = [n for n in given if n not in names]
    if extra:
        fail(f"kernel {kernel!r} has no parameter {', '.join(map(repr, extra))} (it takes {', '.join(names)})")
    if not inst.recorded and not inst.autotune:
        listed = [n for n in names if n in given]
        if list(given) != listed:
            fail(f"the signature names {list(given)}, kernel {kernel!r} takes {names}: list the arguments in the "
                 "kernel's order")
    out = []
    for p in params:
        a = given.get(p.name)
        if a is None:
            if inst.recorded:
                fail(f"it gives no {p.name!r}, a parameter of the kernel (it takes {', '.join(names)})")
            if not p.has_default:
                fail(f"the signature names {list(given)}, kernel {kernel!r} takes {names}: give {p.name!r}")
            if not p.constexpr and p.default is not None:
                fail(f"give {p.name!r}'s type: it is a runtime argument (its default {value_json(p.default)!r} is "
                     "passed at each call)")
            a = TritonArg(p.name, None, p.default, none=not p.constexpr)
        out.append(_fit_arg(fail, kernel, p, a, inst.recorded))
    return replace(inst, args=tuple(out))


def _fit_arg(fail: Callable[[str], NoReturn], kernel: str, p: TritonParam, a: TritonArg, recorded: bool) -> TritonArg:
    field = f"{p.name!r}"
    if p.constexpr:
        if a.none or (a.type is None and a.value is None):
            return TritonArg(a.name, None, None)
        if a.type is not None:
            text = a.spelling()
            if not recorded and not a.pointer and not a.divisible and not a.one and a.type in BY_VALUE:
                name = {"i1": "int1", "u1": "int1", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
                        "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64"}.get(a.type, a.type)
                fail(f"{field} is a tl.constexpr of kernel {kernel!r}, and {text!r} reads as a runtime argument's "
                     f"type (earlier releases took it so, and Triton then failed): write {p.name} = "
                     f"{{ dtype = \"{name}\" }} for the tl.dtype, or {p.name} = {{ str = \"{text}\" }} for the string")
            fail(f"{field} is a tl.constexpr of kernel {kernel!r}: give its value, not the type {text!r}")
        return a
    if a.none or (a.type is None and a.value is None):
        return TritonArg(a.name, None, None, none=True)
    if a.type is None:
        fail(f"{field} is a runtime argument of kernel {kernel!r} (its annotation is not tl.constexpr), not a "
             f"constexpr: give its type ('i32', 'i32:16' for a multiple of 16, 'i32:1' for 1, '*fp32:16', 'fp32', "
             f"'u1', 'none'), not the value {value_json(a.value)!r}; to compile a value in, annotate the parameter "
             f"`{p.name}: tl.constexpr`")
    if p.annotation and not _annotated(p.annotation, a.type):
        fail(f"{field} is annotated {p.annotation!r} in kernel {kernel!r}, which Triton compiles it as; the "
             f"signature gives {a.spelling()!r}")
    return a
