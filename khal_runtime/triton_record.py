"""Constexpr values as keys, and the lock file's spelling of a Triton variant, at run time.

:func:`canon` makes a constexpr's value a key (``True``, ``1`` and ``1.0`` apart; a ``tl.dtype``
and the manifest's :class:`~khal_runtime.manifest.TritonDtype` alike). :func:`lock_table` writes
one ``[[variant]]`` table of the lock file (notes/triton-jit.md: what ``python -m hatch_khal triton
record`` writes and the build reads; the run time names it in
:class:`~khal_runtime.errors.TritonMissingVariantError` and appends it to ``KHAL_TRITON_RECORD``
when a call goes to Triton's JIT). The TOML is written here by hand: the run time has no TOML
writer among its dependencies, and a table of strings, numbers, booleans and two inline tables
needs none.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from typing import Any

from khal_runtime.manifest_records import TritonDtype

__all__ = ["RECORD_DEFAULT", "RECORD_VAR", "append_record", "canon", "lock_table", "show", "uncanon"]

#: ``KHAL_TRITON_RECORD``: where the JIT fallback appends the variants it compiled (lock format)
RECORD_VAR = "KHAL_TRITON_RECORD"
RECORD_DEFAULT = "khal-triton.missing.lock"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


# -- constexpr values ------------------------------------------------------------------------------

def canon(v: Any) -> Any:
    """A constexpr's value as a key: equal for the values Triton's JIT compiles alike, apart for the
    others (``True`` / ``1`` / ``1.0``; an int and a NumPy int are alike; a ``tl.dtype`` and the
    manifest's :class:`~khal_runtime.manifest.TritonDtype` of its name are alike)."""
    t = type(v)
    if t is int or v is None or t is str:
        return v
    if t is bool:
        return (bool, v)
    if t is float:
        return (float, v)
    if t.__name__ == "TritonDtype" and isinstance(getattr(v, "dtype", None), str):
        return ("dtype", v.dtype)  # the manifest's (its plain record, or the pydantic model)
    if t.__name__ == "constexpr" and hasattr(v, "value"):  # tl.constexpr(x)
        return canon(v.value)
    name = getattr(v, "name", None)
    if isinstance(name, str) and (t.__name__ == "dtype" or "dtype" in (c.__name__ for c in t.__mro__)):
        return ("dtype", name)  # a tl.dtype (Triton's, or the stand-in's)
    if isinstance(v, bool):
        return (bool, bool(v))
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return (float, float(v))
    item = getattr(v, "item", None)  # a NumPy scalar
    if callable(item) and getattr(v, "shape", None) == ():
        try:
            return canon(item())
        except Exception:  # noqa: BLE001 - not a scalar after all
            pass
    return ("object", repr(v))


def uncanon(c: Any) -> Any:
    """A canonical value back as the lock file / a message writes it (a ConstValue)."""
    if type(c) is tuple:
        if c[0] is bool or c[0] is float:
            return c[1]
        if c[0] == "dtype":
            return TritonDtype({"dtype": c[1]})
        return c[1]
    return c


def show(v: Any) -> str:
    v = uncanon(v)
    if type(v).__name__ == "TritonDtype":
        return f"tl.{v.dtype}"
    return repr(v)


def _toml_key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if type(v).__name__ == "TritonDtype":
        return f"{{ dtype = {json.dumps(v.dtype)} }}"
    if v is None:
        return "{ none = true }"
    if type(v) is bool:
        return "true" if v else "false"
    if type(v) is int:
        return str(v)
    if type(v) is float:
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return json.dumps(str(v))


def _inline(d: dict[str, Any], raw: bool = False) -> str:
    if not d:
        return "{}"
    return "{ " + ", ".join(f"{_toml_key(k)} = {json.dumps(v) if raw else _toml_value(v)}" for k, v in d.items()) + " }"


def lock_table(crate: str, kernel: str, args: dict[str, str], constexprs: dict[str, Any],
               options: tuple[Any, ...] | None, *, module: str | None = None, config: int | None = None) -> str:
    """One ``[[variant]]`` table of the lock file (notes/triton-jit.md): ``args`` in the lock's
    spelling, ``constexprs`` ConstValues, ``options`` (num_warps, num_stages, num_ctas, maxnreg)."""
    lines = ["[[variant]]", f"crate = {json.dumps(crate)}", f"kernel = {json.dumps(kernel)}"]
    if module:
        lines.append(f"module = {json.dumps(module)}")
    lines.append(f"args = {_inline(args, raw=True)}")
    lines.append(f"constexprs = {_inline(constexprs)}")
    if options is not None:
        nw, ns, nc, mr = options
        lines += [f"num_warps = {nw}", f"num_stages = {ns}"]
        if nc not in (None, 1):
            lines.append(f"num_ctas = {nc}")
        if mr is not None:
            lines.append(f"maxnreg = {mr}")
    if config is not None:
        lines.append(f"config = {config}")
    return "\n".join(lines) + "\n"


_record_lock = threading.Lock()


def append_record(text: str) -> str:
    """Append lock tables to the record file (``KHAL_TRITON_RECORD``, default
    ``khal-triton.missing.lock`` here), made with the lock's ``version = 1`` first; its path."""
    path = os.environ.get(RECORD_VAR) or RECORD_DEFAULT
    with _record_lock:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write("# Variants Triton's JIT compiled for calls the package's build does not cover (khal's JIT\n"
                        "# fallback); merge into khal-triton.lock (python -m hatch_khal triton record) and rebuild.\n"
                        "version = 1\n")
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return path
