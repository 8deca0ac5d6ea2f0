"""A Triton crate's instances: what the crate's ``instances`` tables declare, checked and expanded.

Each table names one ``@triton.jit`` kernel and its signature in Triton's own spelling, in the
kernel's argument order::

    [[tool.hatch.build.hooks.khal.crates.instances]]
    kernel = "add_kernel"
    name = "add_{T}"                       # optional: the entry's name ({KEY} from the matrix)
    signature = { x_ptr = "*{T}:16", y_ptr = "*{T}:16", out_ptr = "*{T}:16", n_elements = "i32:16",
                  BLOCK_SIZE = 1024 }
    matrix = { T = ["fp32", "fp16"] }      # one instance per combination
    num_warps = 4
    num_stages = 3
    num_ctas = 1                           # optional, sm_90+: each program a cluster of this many CTAs

A value is a type (``*fp32``: a pointer to fp32; ``i32``; ``:16`` after it: the binary may assume
the pointer 16-byte aligned, the integer divisible by 16; ``:1`` after an integer: the binary
assumes it is 1, compiled in, as Triton's JIT does for unit strides) or a constexpr's value (an int, float or
bool, or a string that reads as one after the matrix is applied). An instance with ``:16`` / ``:1``
assumptions is built twice: as written, and as a conservative ``<name>__base`` entry without them
(``fallback = false`` leaves it out), so that a call that breaks an assumption still runs.

``autotune = true`` (a kernel under ``@triton.autotune``): the worker builds one variant per
``triton.Config`` (the signature leaves out the constexprs the configs set); ``choose`` is the
author's rule for the config (``"time"``: timed at run time, ``"first"``, an index).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Mapping

from hatch_khal.errors import ConfigError

__all__ = ["POINTEE_TYPES", "SCALAR_TYPES", "TritonArg", "TritonInstance", "parse_instances"]

#: Triton scalar type -> khal scalar name (``khal_runtime.abi.SCALARS``)
SCALAR_TYPES = {"i1": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
                "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
                "fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}
#: what a pointer may point at (the scalars, and Triton's fp8 kinds)
POINTEE_TYPES = {**SCALAR_TYPES, "fp8e4nv": "uint8", "fp8e5": "uint8"}
#: scalar kernel arguments passed by value (Triton's by-value types)
BY_VALUE = {"i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64"}
_TYPE = re.compile(r"^(\*?)([a-z0-9]+)(?::(\d+))?$")
_KEYS = {"kernel", "name", "signature", "matrix", "num_warps", "num_stages", "num_ctas", "fallback", "autotune",
         "choose"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class TritonArg:
    name: str
    #: a runtime argument: its Triton type ("*fp32", "i32"); a constexpr: None
    type: str | None
    #: the constexpr's value
    value: int | float | bool | None = None
    #: the binary assumes 16-byte alignment (a pointer) or divisibility by 16 (an integer)
    divisible: bool = False
    #: the binary assumes the integer is 1 (``i32:1``, Triton's specialisation of unit strides): it is
    #: compiled in as a constexpr and is not a parameter of that binary
    one: bool = False

    @property
    def pointer(self) -> bool:
        return self.type is not None and self.type.startswith("*")


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

    @property
    def runtime_args(self) -> tuple[TritonArg, ...]:
        return tuple(a for a in self.args if a.type is not None)

    def triton_signature(self) -> dict[str, str]:
        """What Triton compiles: a constexpr for each constexpr and each argument assumed 1."""
        return {a.name: a.type if a.type is not None and not a.one else "constexpr" for a in self.args}

    def constexprs(self) -> dict[str, int | float | bool]:
        """The kernel's own constexprs (not the arguments assumed 1)."""
        return {a.name: a.value for a in self.args if a.type is None}  # type: ignore[misc]

    def compile_constexprs(self) -> dict[str, int | float | bool]:
        """What Triton gets as constants: the constexprs and the arguments assumed 1."""
        return {**self.constexprs(), **{a.name: 1 for a in self.args if a.one}}

    def divisible(self) -> list[str]:
        return [a.name for a in self.args if a.divisible]

    def ones(self) -> list[str]:
        return [a.name for a in self.args if a.one]

    def record(self) -> dict[str, Any]:
        """What the entry hash covers of the instance (the autotune options only when given: an
        instance without them hashes as before they existed)."""
        out: dict[str, Any] = {"kernel": self.kernel, "signature": self.triton_signature(),
                               "constexprs": self.constexprs(), "divisible": self.divisible(), "ones": self.ones(),
                               "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.autotune:
            out["autotune"] = True
            out["choose"] = self.choose
        if self.num_ctas != 1:
            out["num_ctas"] = self.num_ctas
        return out


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


def _arg(where: str, name: str, raw: Any) -> TritonArg:
    if isinstance(raw, bool) or isinstance(raw, (int, float)):
        return TritonArg(name, None, raw)
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: signature field {name!r}: {raw!r} is neither a Triton type ('*fp32', 'i32', "
                          "'*fp32:16') nor a constexpr value (an int, float or bool)")
    text = raw.strip()
    m = _TYPE.match(text)
    if m is None or text in ("true", "false"):
        value = _literal(text)
        if value is None:
            raise ConfigError(f"{where}: signature field {name!r}: {raw!r} is neither a Triton type ('*fp32', 'i32', "
                              "'*fp32:16') nor a constexpr value")
        return TritonArg(name, None, value)
    star, base, spec = m.groups()
    if not star and base not in BY_VALUE:
        value = _literal(text)
        if value is not None:
            return TritonArg(name, None, value)
    table = POINTEE_TYPES if star else BY_VALUE
    if base not in table:
        raise ConfigError(f"{where}: signature field {name!r}: {base!r} in {raw!r} is not a Triton "
                          f"{'pointee' if star else 'scalar'} type (one of {', '.join(sorted(table))})")
    if spec is not None:
        if spec not in ("16", "1"):
            raise ConfigError(f"{where}: signature field {name!r}: ':{spec}' in {raw!r} is not a specialisation "
                              "Triton makes (':16': 16-byte aligned pointer / integer divisible by 16; ':1': an "
                              "integer equal to 1)")
        if spec == "1" and (star or base not in ("i32", "i64", "u32", "u64")):
            raise ConfigError(f"{where}: signature field {name!r}: ':1' in {raw!r} applies to integers only")
        if not star and base not in ("i32", "i64", "u32", "u64"):
            raise ConfigError(f"{where}: signature field {name!r}: ':16' in {raw!r} applies to pointers and "
                              "integers only")
    return TritonArg(name, (star + base), None, spec == "16", spec == "1")


def _fill(where: str, text: str, combo: Mapping[str, Any]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in combo:
            raise ConfigError(f"{where}: {text!r} names {{{m.group(1)}}}, which the instance's 'matrix' does not "
                              f"give (it gives: {', '.join(combo) or 'nothing'})")
        return str(combo[m.group(1)])

    return _PLACEHOLDER.sub(sub, text)


def _positive(where: str, key: str, raw: Any, default: int, power_of_two: bool) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1 or raw > 32 or \
            (power_of_two and raw & (raw - 1)):
        what = "a power of two from 1 to 32" if power_of_two else "an integer from 1 to 32"
        raise ConfigError(f"{where}: option {key!r} is {raw!r}, not {what}")
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


def parse_instances(crate: str, raw: Any) -> list[TritonInstance]:
    """The crate's instances, matrices expanded, each with its conservative twin. ConfigError naming
    the crate, the instance and the field for anything it cannot build."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"crate {crate!r}: a Triton crate needs 'instances': a list of tables, each naming a "
                          "@triton.jit kernel and its signature (see docs/guide/triton.md)")
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
        matrix = table.get("matrix", {})
        if not isinstance(matrix, dict) or any(not isinstance(v, list) or not v for v in matrix.values()):
            raise ConfigError(f"{where}: option 'matrix' must be a table of non-empty lists ({{ T = [\"fp32\", "
                              "\"fp16\"] }})")
        fallback = table.get("fallback", True)
        if not isinstance(fallback, bool):
            raise ConfigError(f"{where}: option 'fallback' must be true or false (got {fallback!r})")
        warps = _positive(where, "num_warps", table.get("num_warps"), 4, True)
        stages = _positive(where, "num_stages", table.get("num_stages"), 3, False)
        ctas = table.get("num_ctas", 1)
        if isinstance(ctas, bool) or not isinstance(ctas, int) or ctas not in (1, 2, 4, 8):
            raise ConfigError(f"{where}: option 'num_ctas' is {ctas!r}, not 1, 2, 4 or 8 (the CTAs of a program's "
                              "thread-block cluster, sm_90+; 16 is not portable)")
        autotune = table.get("autotune", False)
        if not isinstance(autotune, bool):
            raise ConfigError(f"{where}: option 'autotune' must be true or false (got {autotune!r})")
        choose = _choose(where, table, autotune)
        keys = list(matrix)
        for values in itertools.product(*(matrix[k] for k in keys)):
            combo = dict(zip(keys, values))
            label = ", ".join(f"{k}={v}" for k, v in combo.items())
            here = f"{where}" + (f" [{label}]" if label else "")
            raw_name = table.get("name")
            if raw_name is None:
                name = "_".join([kernel, *(re.sub(r"\W", "_", str(v)) for v in values)])
            elif isinstance(raw_name, str):
                name = _fill(f"{here}: option 'name'", raw_name, combo)
            else:
                raise ConfigError(f"{here}: option 'name' must be a string (got {raw_name!r})")
            if not _NAME.match(name) or "__" in name:
                raise ConfigError(f"{here}: entry name {name!r} is not an identifier without '__' (option 'name')")
            args = []
            for arg, value in sig.items():
                if isinstance(value, str):
                    value = _fill(f"{here}: signature field {arg!r}", value, combo)
                args.append(_arg(f"{here}", arg, value))
            for name_ in (name, f"{name}__base"):
                if name_ in seen:
                    raise ConfigError(f"{here}: entry name {name_!r} is also the name of {seen[name_]}; give the "
                                      "instances distinct names (option 'name', with {KEY} from the matrix)")
                seen[name_] = here
            inst = TritonInstance(name, kernel, tuple(args), warps, stages, family=name, autotune=autotune,
                                  choose=choose, num_ctas=ctas)
            out.append(inst)
            if fallback and any(a.divisible or a.one for a in args):
                plain = tuple(TritonArg(a.name, a.type, a.value) for a in args)
                out.append(TritonInstance(f"{name}__base", kernel, plain, warps, stages, family=name, base=True,
                                          autotune=autotune, choose=choose, num_ctas=ctas))
    return out
