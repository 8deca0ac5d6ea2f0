"""The Triton lock file (``khal-triton.lock`` at the project root, hook option ``triton-lock``): the
variants ``python -m hatch_khal triton record`` saw Triton's JIT compile, which the build compiles
beside each crate's hand-written instances (notes/triton-jit.md, "The lock file")::

    version = 1

    [[variant]]
    crate = "tutorials"
    kernel = "add_kernel"          # the function's __qualname__ as its module defines it
    module = "liger_kernel.ops.rms_norm"   # only for a crate whose sources are modules (companions)
    args = { x_ptr = "*fp32:16", y_ptr = "*fp32:16", output_ptr = "*fp32:16", n_elements = "i32:16" }
    constexprs = { BLOCK_SIZE = 1024 }
    num_warps = 4
    num_stages = 3
    # num_ctas = 2; maxnreg = 128; config = 3 (the index of the @triton.autotune config it is)

This module is the build's reader (parsing and validation only): :func:`read`, and the name an
entry of a variant takes (:func:`entry_name`, over :func:`canonical_json`). Every error names the
file, the variant's index and the field.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from khal_runtime.manifest import ConstValue, TritonDtype

from hatch_khal.errors import ConfigError
from hatch_khal.triton.instances import DTYPE_NAMES, parse_type

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["DEFAULT_LOCK", "LOCK_VERSION", "LockVariant", "canonical_json", "const_json", "entry_name", "read"]

#: the lock file's name at the project root when the hook option ``triton-lock`` does not say another
DEFAULT_LOCK = "khal-triton.lock"
LOCK_VERSION = 1
_KEYS = {"crate", "kernel", "module", "args", "constexprs", "num_warps", "num_stages", "num_ctas", "maxnreg", "config"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUALNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class LockVariant:
    """One ``[[variant]]``: a specialisation of a kernel as Triton's JIT compiled it for a launch."""

    crate: str
    kernel: str
    #: the module defining the kernel, for a crate whose sources are modules (companions); else None
    module: Optional[str] = None
    #: runtime argument -> its spelling (``*fp32:16``, ``i32``, ``i32:1``, ``u1``, ``none``)
    args: dict[str, str] = field(default_factory=dict)
    #: constexpr parameter -> its value
    constexprs: dict[str, ConstValue] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1
    maxnreg: Optional[int] = None
    #: the index of the ``@triton.autotune`` config the launch ran (its kwargs are among ``constexprs``)
    config: Optional[int] = None


def const_json(value: ConstValue) -> Any:
    """A constexpr's value as the lock file spells it, in JSON: ``{"dtype": "fp32"}``, ``{"none": true}``."""
    if isinstance(value, TritonDtype):
        return {"dtype": value.dtype}
    if value is None:
        return {"none": True}
    return value


def canonical_json(v: LockVariant) -> str:
    """The variant's canonical JSON (every field, defaults included, keys sorted): what its entry's
    name is derived from, so the same variant, however written, makes the same entry."""
    return json.dumps({"crate": v.crate, "kernel": v.kernel, "module": v.module, "args": v.args,
                       "constexprs": {k: const_json(c) for k, c in v.constexprs.items()},
                       "num_warps": v.num_warps, "num_stages": v.num_stages, "num_ctas": v.num_ctas,
                       "maxnreg": v.maxnreg, "config": v.config}, sort_keys=True, separators=(",", ":"))


def entry_name(v: LockVariant) -> str:
    """The entry a lock variant becomes: ``<kernel>__v<8 hex of its canonical JSON>``."""
    digest = hashlib.sha256(canonical_json(v).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', v.kernel)}__v{digest}"


def _const(where: str, raw: Any) -> ConstValue:
    if isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, dict) and set(raw) == {"dtype"} and isinstance(raw["dtype"], str):
        if raw["dtype"] not in DTYPE_NAMES:
            raise ConfigError(f"{where}: {{ dtype = {raw['dtype']!r} }} is not a Triton dtype's name (tl.dtype.name: "
                              f"{', '.join(DTYPE_NAMES)})")
        return TritonDtype(dtype=raw["dtype"])
    if isinstance(raw, dict) and raw == {"none": True}:
        return None
    raise ConfigError(f"{where}: {raw!r} is not a constexpr value (an int, float, bool, string, "
                      "{ dtype = \"fp32\" } or { none = true })")


def _int(where: str, raw: Any, low: int, high: int, powers: bool = False) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high or (powers and raw & (raw - 1)):
        what = "a power of two" if powers else "an integer"
        raise ConfigError(f"{where}: {raw!r} is not {what} from {low} to {high}")
    return raw


def _variant(path: str, i: int, table: Any) -> LockVariant:
    where = f"{path}: variant[{i}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: is {table!r}, not a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))} (a variant takes "
                          f"{', '.join(sorted(_KEYS))})")
    for key in ("crate", "kernel"):
        if not isinstance(table.get(key), str):
            raise ConfigError(f"{where}: field {key!r} is {'missing' if key not in table else repr(table[key])}: "
                              f"it must be a string")
    crate, kernel = table["crate"], table["kernel"]
    if not _QUALNAME.fullmatch(kernel):
        raise ConfigError(f"{where}: field 'kernel' is {kernel!r}, not a function's __qualname__")
    where = f"{path}: variant[{i}] ({crate}.{kernel})"
    module = table.get("module")
    if module is not None and (not isinstance(module, str) or not _QUALNAME.fullmatch(module)):
        raise ConfigError(f"{where}: field 'module' is {module!r}, not a dotted module name")
    args, constexprs = table.get("args", {}), table.get("constexprs", {})
    for key, value in (("args", args), ("constexprs", constexprs)):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: field {key!r} is {value!r}, not a table")
    out_args: dict[str, str] = {}
    for name, spelling in args.items():
        here = f"{where}: field 'args.{name}'"
        if not _IDENT.fullmatch(name):
            raise ConfigError(f"{here}: {name!r} is not a parameter name")
        if not isinstance(spelling, str):
            raise ConfigError(f"{here}: {spelling!r} is not a runtime argument's type ('*fp32:16', 'i32', 'none')")
        parse_type(here, spelling)  # ConfigError naming it
        out_args[name] = spelling
    out_consts: dict[str, ConstValue] = {}
    for name, value in constexprs.items():
        if not _IDENT.fullmatch(name):
            raise ConfigError(f"{where}: field 'constexprs.{name}': {name!r} is not a parameter name")
        if name in out_args:
            raise ConfigError(f"{where}: {name!r} is in both 'args' and 'constexprs'")
        out_consts[name] = _const(f"{where}: field 'constexprs.{name}'", value)
    maxnreg = table.get("maxnreg")
    config = table.get("config")
    return LockVariant(
        crate=crate, kernel=kernel, module=module, args=out_args, constexprs=out_consts,
        num_warps=_int(f"{where}: field 'num_warps'", table.get("num_warps", 4), 1, 32, powers=True),
        num_stages=_int(f"{where}: field 'num_stages'", table.get("num_stages", 3), 1, 32),
        num_ctas=_int(f"{where}: field 'num_ctas'", table.get("num_ctas", 1), 1, 8, powers=True),
        maxnreg=None if maxnreg is None else _int(f"{where}: field 'maxnreg'", maxnreg, 1, 255),
        config=None if config is None else _int(f"{where}: field 'config'", config, 0, 1 << 20))


def read(path: Path | str) -> list[LockVariant]:
    """Every variant of the lock file at ``path``, in the file's order. ConfigError naming the
    file, the variant's index and the field for anything unreadable."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the Triton lock file: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a TOML file: {exc}") from None
    unknown = sorted(set(data) - {"version", "variant"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))} (a lock file has 'version' and "
                          "'[[variant]]' tables)")
    if data.get("version") != LOCK_VERSION:
        raise ConfigError(f"{path}: field 'version' is {data.get('version')!r}; this hatch-khal reads version "
                          f"{LOCK_VERSION} (record it again: python -m hatch_khal triton record)")
    variants = data.get("variant", [])
    if not isinstance(variants, list):
        raise ConfigError(f"{path}: 'variant' must be an array of tables ([[variant]])")
    return [_variant(str(path), i, t) for i, t in enumerate(variants)]
