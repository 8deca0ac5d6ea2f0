"""The Triton lock file: the variants ``python -m hatch_khal triton record`` saw Triton's JIT
compile, which the build compiles beside a crate's hand-written instances (notes/triton-jit.md).

```toml
# Written by `python -m hatch_khal triton record`; merged on re-record. ...
version = 1

[[variant]]
crate = "tutorials"
kernel = "add_kernel"
args = { x_ptr = "*fp32:16", y_ptr = "*fp32:16", output_ptr = "*fp32:16", n_elements = "i32:16" }
constexprs = { BLOCK_SIZE = 1024 }
num_warps = 4
num_stages = 3
```

One ``[[variant]]`` table per variant, sorted by crate, kernel, module, then the canonical JSON of
the rest (:meth:`LockVariant.canonical`), so that a re-record changes only the lines of what
changed. ``args`` and ``constexprs`` are inline tables (one line per variant, in the kernel's
parameter order). Optional keys: ``module`` (a crate whose sources are modules), ``num_ctas``
(when not 1), ``maxnreg``, ``config`` (the index of the ``@triton.autotune`` config).

Read with ``tomllib`` (``tomli`` before 3.11). Written by hand, not with ``tomli-w``: it writes a
table inside an array of tables as a ``[variant.args]`` section (not an inline table) and cannot
write the header comment; what is written is read back and compared before it replaces the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from khal_runtime.manifest import ConstValue, TritonDtype

from hatch_khal.errors import ConfigError

__all__ = ["DEFAULT_LOCK", "HEADER", "VERSION", "LockVariant", "canonical_json", "const_json", "dumps", "entry_name",
           "loads", "merge", "read", "write"]

#: the lock file's name in the project root (hook option ``triton-lock`` names another)
DEFAULT_LOCK = "khal-triton.lock"
VERSION = 1
HEADER = (
    "# Written by `python -m hatch_khal triton record`; merged on re-record. Each [[variant]] is one\n"
    "# specialisation Triton's JIT compiled for a launch; the build compiles each for every arch.\n"
)

#: what a pointer may point at (Triton 3.6's type names: ``triton.runtime.jit.type_canonicalisation_dict``)
POINTEE_TYPES = frozenset({"i1", "u1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32",
                           "fp64", "fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16"})
#: the types of arguments passed by value
SCALAR_TYPES = frozenset({"i1", "u1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32",
                          "fp64"})
_INTEGERS = frozenset({"i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"})
_ARG = re.compile(r"^(\*?)([a-z][a-z0-9]*)(?::(\d+))?$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CRATE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_KEYS = ("crate", "kernel", "module", "args", "constexprs", "num_warps", "num_stages", "num_ctas", "maxnreg", "config")
_INT64 = (-(2**63), 2**63)


@dataclass(frozen=True)
class LockVariant:
    """One ``[[variant]]``: a specialisation of ``kernel`` (its ``__qualname__``) of ``crate``.

    ``args``: each runtime argument's spelling (``*fp32:16``, ``i32``, ``i32:1``, ``none``);
    ``constexprs``: each constexpr's value (int, float, bool, str, :class:`TritonDtype`, None).
    Equal variants are those with equal :meth:`canonical` text (the order of ``args`` aside)."""

    crate: str
    kernel: str
    #: the module defining the kernel, for a crate whose sources are modules (a companion); else None
    module: Optional[str] = None
    args: dict[str, str] = field(default_factory=dict)
    constexprs: dict[str, ConstValue] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1
    maxnreg: Optional[int] = None
    config: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        """The variant as JSON data, in the file's key order (optional keys only when set)."""
        out: dict[str, Any] = {"crate": self.crate, "kernel": self.kernel}
        if self.module is not None:
            out["module"] = self.module
        out["args"] = dict(self.args)
        out["constexprs"] = {k: _const_json(v) for k, v in self.constexprs.items()}
        out["num_warps"] = self.num_warps
        out["num_stages"] = self.num_stages
        if self.num_ctas != 1:
            out["num_ctas"] = self.num_ctas
        for key in ("maxnreg", "config"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def canonical(self) -> str:
        """The variant's canonical JSON: keys sorted, no spaces; equal variants, equal text."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def digest(self) -> str:
        """8 hex digits of the sha256 of :meth:`canonical` (the build names a lock variant's entry
        ``<kernel>__v<digest>``)."""
        return hashlib.sha256(self.canonical().encode("utf-8")).hexdigest()[:8]

    def sort_key(self) -> tuple[str, str, str, str]:
        rest = self.to_json()
        for k in ("crate", "kernel", "module"):
            rest.pop(k, None)
        return (self.crate, self.kernel, self.module or "",
                json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LockVariant) and self.canonical() == other.canonical()

    def __hash__(self) -> int:
        return hash(self.canonical())

    def describe(self) -> str:
        """``crate.kernel`` (and its module), for messages."""
        return f"{self.crate}.{self.kernel}" + (f" ({self.module})" if self.module else "")

    @classmethod
    def from_json(cls, data: Any, where: str) -> LockVariant:
        """A variant from JSON / TOML data, every field checked; ConfigError naming ``where`` and the field."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: not a table (got {type(data).__name__})")
        unknown = [k for k in data if k not in _KEYS]
        if unknown:
            raise ConfigError(f"{where}: unknown field {unknown[0]!r} (a variant has {', '.join(_KEYS)})")
        for key in ("crate", "kernel"):
            if key not in data:
                raise ConfigError(f"{where}: field {key!r} is required")
        crate = data["crate"]
        if not isinstance(crate, str) or not _CRATE.fullmatch(crate):
            raise ConfigError(f"{where}: field 'crate': {crate!r} is not a crate name")
        kernel = data["kernel"]
        if not isinstance(kernel, str) or not all(_IDENT.fullmatch(p) for p in kernel.split(".")):
            raise ConfigError(f"{where}: field 'kernel': {kernel!r} is not a kernel's name (its __qualname__)")
        where = f"{where} ({crate}.{kernel})"
        module = data.get("module")
        if module is not None and (not isinstance(module, str) or not all(_IDENT.fullmatch(p) for p in module.split("."))):
            raise ConfigError(f"{where}: field 'module': {module!r} is not a dotted module name")
        args = data.get("args", {})
        if not isinstance(args, Mapping):
            raise ConfigError(f"{where}: field 'args' must be a table of argument name -> type (got {args!r})")
        for name, spelling in args.items():
            _check_arg(where, name, spelling)
        constexprs_raw = data.get("constexprs", {})
        if not isinstance(constexprs_raw, Mapping):
            raise ConfigError(f"{where}: field 'constexprs' must be a table of name -> value (got {constexprs_raw!r})")
        constexprs: dict[str, ConstValue] = {}
        for name, raw in constexprs_raw.items():
            if not isinstance(name, str) or not _IDENT.fullmatch(name):
                raise ConfigError(f"{where}: field 'constexprs': {name!r} is not a parameter name")
            if name in args:
                raise ConfigError(f"{where}: {name!r} is both in 'args' and in 'constexprs'")
            constexprs[name] = _const(f"{where}: field 'constexprs.{name}'", raw)
        # Triton's defaults when a hand-written variant leaves them out (the recorder always writes them)
        num_warps = _int(where, "num_warps", data.get("num_warps", 4), 1, 32, power_of_two=True)
        num_stages = _int(where, "num_stages", data.get("num_stages", 3), 1, 32)
        num_ctas = _int(where, "num_ctas", data.get("num_ctas", 1), 1, 16, power_of_two=True)
        maxnreg = None if data.get("maxnreg") is None else _int(where, "maxnreg", data["maxnreg"], 1, 255)
        config = None if data.get("config") is None else _int(where, "config", data["config"], 0, 1 << 20)
        return cls(crate=crate, kernel=kernel, module=module, args=dict(args), constexprs=constexprs,
                   num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas, maxnreg=maxnreg, config=config)


def _check_arg(where: str, name: Any, spelling: Any) -> None:
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ConfigError(f"{where}: field 'args': {name!r} is not a parameter name")
    what = f"{where}: field 'args.{name}'"
    if not isinstance(spelling, str):
        raise ConfigError(f"{what}: {spelling!r} is not a type (a string: '*fp32:16', 'i32', 'i32:1', 'none')")
    if spelling == "none":
        return
    m = _ARG.fullmatch(spelling)
    if m is None:
        raise ConfigError(f"{what}: {spelling!r} is not a Triton argument type ('*fp32', '*fp32:16', 'i32', "
                          "'i32:16', 'i32:1', 'fp32', 'u1', 'none')")
    star, base, spec = m.groups()
    table = POINTEE_TYPES if star else SCALAR_TYPES
    if base not in table:
        raise ConfigError(f"{what}: {base!r} in {spelling!r} is not a Triton {'pointee' if star else 'scalar'} type "
                          f"(one of {', '.join(sorted(table))})")
    if spec is None:
        return
    if spec not in ("16", "1"):
        raise ConfigError(f"{what}: ':{spec}' in {spelling!r} is not a specialisation Triton makes (':16': a 16-byte "
                          "aligned pointer or an integer divisible by 16; ':1': an integer equal to 1)")
    if spec == "1" and (star or base not in _INTEGERS):
        raise ConfigError(f"{what}: ':1' in {spelling!r} applies to integers only")
    if spec == "16" and not star and base not in _INTEGERS:
        raise ConfigError(f"{what}: ':16' in {spelling!r} applies to pointers and integers only")


def _const(what: str, raw: Any) -> ConstValue:
    if isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, Mapping):
        if set(raw) == {"dtype"} and isinstance(raw["dtype"], str):
            from hatch_khal.triton.instances import DTYPE_NAMES  # lazy: instances imports this module's types

            if raw["dtype"] not in DTYPE_NAMES:
                raise ConfigError(f"{what}: {{ dtype = {raw['dtype']!r} }} is not a Triton dtype's name "
                                  f"(tl.dtype.name: {', '.join(DTYPE_NAMES)})")
            return TritonDtype(dtype=raw["dtype"])
        if set(raw) == {"none"} and raw["none"] is True:
            return None
    raise ConfigError(f"{what}: {raw!r} is not a constexpr value (an int, float, bool or string, "
                      "{ dtype = \"fp32\" } for a tl.dtype, { none = true } for None)")


def _const_json(value: ConstValue) -> Any:
    if isinstance(value, TritonDtype):
        return {"dtype": value.dtype}
    if value is None:
        return {"none": True}
    return value


def _int(where: str, key: str, raw: Any, lo: int, hi: int, *, power_of_two: bool = False) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi or (power_of_two and raw & (raw - 1)):
        kind = "a power of two" if power_of_two else "an integer"
        raise ConfigError(f"{where}: field {key!r}: {raw!r} is not {kind} from {lo} to {hi}")
    return raw


# ---------------------------------------------------------------------------------------------
# reading


def _toml() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib  # lazy: only reading a lock file needs a TOML parser
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib  # lazy, as above
    return tomllib


def loads(text: str, where: str) -> list[LockVariant]:
    """The variants of a lock file's text (``where``: the file, for messages); ConfigError naming
    the file, the variant's index (and its line) and the field at fault."""
    tomllib = _toml()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc}); re-record it with `python -m hatch_khal triton "
                          "record` or fix the line") from None
    unknown = [k for k in data if k not in ("version", "variant")]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (a lock file has 'version' and [[variant]] tables)")
    version = data.get("version")
    if version != VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            raise ConfigError(f"{where}: lock file version {version} was written by a newer hatch-khal (this one "
                              f"reads version {VERSION}); upgrade hatch-khal")
        raise ConfigError(f"{where}: 'version = {VERSION}' is required at the top (got {version!r})")
    tables = data.get("variant", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{where}: 'variant' must be an array of tables ([[variant]])")
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if line.strip() == "[[variant]]"]
    out = []
    for i, table in enumerate(tables):
        at = f" (line {lines[i]})" if len(lines) == len(tables) else ""
        out.append(LockVariant.from_json(table, f"{where}: variant[{i}]{at}"))
    return out


def read(path: str | os.PathLike[str]) -> list[LockVariant]:
    """The variants of the lock file at ``path`` (ConfigError when it is missing or invalid)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such lock file; record one with `python -m hatch_khal triton record -- "
                          "<command>`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read the lock file ({exc})") from None
    return loads(text, str(p))


# ---------------------------------------------------------------------------------------------
# writing

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(s: str) -> str:
    out = []
    for c in s:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _tkey(k: str) -> str:
    return k if _BARE.fullmatch(k) else _string(k)


def _value(v: Any, what: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        if not _INT64[0] <= v < _INT64[1]:
            raise ConfigError(f"{what}: {v} does not fit TOML's 64-bit integers")
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)  # 0.5, 1e-05, inf, -inf: all TOML floats
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, Mapping):
        return _inline(v, what)
    raise ConfigError(f"{what}: {v!r} cannot be written to a lock file")


def _inline(table: Mapping[str, Any], what: str) -> str:
    if not table:
        return "{}"
    return "{ " + ", ".join(f"{_tkey(k)} = {_value(v, f'{what}.{k}')}" for k, v in table.items()) + " }"


def dumps(variants: Iterable[LockVariant]) -> str:
    """The lock file's text for ``variants`` (sorted, duplicates dropped)."""
    parts = [HEADER, f"version = {VERSION}\n"]
    for v in merge([], variants):
        parts.append("\n[[variant]]\n")
        for key, value in v.to_json().items():
            parts.append(f"{key} = {_value(value, f'{v.describe()}: {key}')}\n")
    return "".join(parts)


def write(path: str | os.PathLike[str], variants: Iterable[LockVariant]) -> None:
    """Write the lock file (sorted, deduplicated) atomically: a temporary file in the same folder,
    read back and compared, then renamed over ``path``."""
    p = Path(path)
    wanted = merge([], variants)
    text = dumps(wanted)
    if loads(text, f"{p} (as written)") != wanted:  # pragma: no cover - a writer bug, never the user's
        raise ConfigError(f"{p}: the lock file as written does not read back the same; nothing was written")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, os.stat(p).st_mode & 0o7777)
        except FileNotFoundError:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def merge(old: Iterable[LockVariant], new: Iterable[LockVariant]) -> list[LockVariant]:
    """The union of ``old`` and ``new``, each variant once, sorted as the file is."""
    seen: dict[str, LockVariant] = {}
    for v in [*old, *new]:
        seen.setdefault(v.canonical(), v)
    return sorted(seen.values(), key=LockVariant.sort_key)


def const_json(value: ConstValue) -> Any:
    """A constexpr's value as the lock file spells it, in JSON: ``{"dtype": "fp32"}``, ``{"none": true}``."""
    return _const_json(value)


def canonical_json(v: LockVariant) -> str:
    """The variant's canonical JSON (:meth:`LockVariant.canonical`): what its entry's name is derived from."""
    return v.canonical()


def entry_name(v: LockVariant) -> str:
    """The entry a lock variant becomes: ``<kernel>__v<8 hex of its canonical JSON>`` (a nested
    function's dots become underscores)."""
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', v.kernel)}__v{v.digest()}"
