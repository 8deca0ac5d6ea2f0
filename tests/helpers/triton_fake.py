"""Triton crates on the fake driver without a build: manifests with the kernel's whole signature
(``TritonFacts.params``), variants spelt as the lock file spells them, heuristics, module / qualname.

``variant("add_kernel", PARAMS, {"x": "*fp32:16", "n": "i32:16"}, {"BLOCK": 1024})`` is one entry
(named ``<kernel>__v<8 hex>`` as a lock variant, hashed as a build hashes it); :func:`load_crate`
writes a package of them and loads it (``fake_kernels``), with the crate's ``triton`` facts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from khal_runtime import abi
from khal_runtime.manifest import Entry, Param, TritonFacts, TritonParam

from tests.helpers.fakecuda import CONTENT, FakeDriver, ptx_param_layouts, write_package

#: Triton scalar type -> khal scalar type (what the build packs a runtime scalar as)
SCALARS = {"i32": "int32", "i64": "int64", "u64": "uint64", "fp32": "float32", "u1": "bool", "i1": "bool"}


def param(name: str, constexpr: bool = False, default: Any = "no default", **kw: Any) -> TritonParam:
    """A kernel parameter; ``default`` given: it has that default."""
    if default != "no default":
        return TritonParam(name=name, constexpr=constexpr, default=default, has_default=True, **kw)
    return TritonParam(name=name, constexpr=constexpr, **kw)


def variant(kernel: str, params: list[TritonParam], args: dict[str, str], constexprs: dict[str, Any], *,
            num_warps: int = 4, num_stages: int = 3, name: str | None = None, family: str | None = None,
            heuristics: tuple[str, ...] = (), module: str | None = None, qualname: str | None = None,
            shared: int = 0, **extra: Any) -> Entry:
    """One entry of ``kernel``: ``args`` each runtime parameter's spelling (``*fp32:16``, ``i32``,
    ``i32:1``, ``none``), ``constexprs`` every constexpr's value; ``extra``: other TritonFacts fields
    (``config``, ``autotune_key``, ``choose``, ``maxnreg``, ``num_ctas``)."""
    names, types, divisible, ones, nones = [], [], [], [], []
    for p in params:
        if p.constexpr:
            continue
        spelt = args[p.name]
        if spelt == "none":
            nones.append(p.name)
            continue
        ty, _, attr = spelt.partition(":")
        names.append(p.name)
        types.append(ty)
        if attr == "16":
            divisible.append(p.name)
        elif attr == "1":
            ones.append(p.name)
    canon = json.dumps([args, {k: repr(v) for k, v in constexprs.items()}, num_warps, num_stages,
                        sorted(extra.items(), key=str)], sort_keys=True, default=str)
    ename = name or f"{kernel}__v{hashlib.sha256(canon.encode()).hexdigest()[:8]}"
    facts = TritonFacts(kernel=kernel, family=family or ename, num_warps=num_warps, num_stages=num_stages,
                        shared=shared, names=tuple(names), types=tuple(types), divisible=tuple(divisible),
                        ones=tuple(ones), nones=tuple(nones), constexprs=dict(constexprs), params=tuple(params),
                        heuristics=heuristics, module=module, qualname=qualname or kernel, cache_key="ck",
                        triton_version="3.6.0", **extra)
    u64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
    eparams: list[Param] = []
    for n, t in zip(names, types):
        if n in ones:
            continue
        if t.startswith("*"):
            eparams.append(Param(name=n, **u64))  # type: ignore[arg-type]
        else:
            s = abi.scalar(SCALARS[t])
            eparams.append(Param(name=n, kind="scalar", element_type=s.name, element_size=s.size,
                                 element_align=s.size))
    eparams += [Param(name=n, **u64) for n in ("khal_global_scratch", "khal_profile_scratch")]  # type: ignore[arg-type]
    block = (num_warps * 32, 1, 1)
    sig = abi.entry_signature(ename, block, tuple(eparams), grid_dims=3, attributes=None, triton=facts.record())
    h = abi.entry_hash(CONTENT, sig)
    return Entry(name=ename, symbol=abi.symbol_for(ename, h), hash=h, block_size=block, params=tuple(eparams),
                 grid_dims=3, triton=facts)


def load_crate(drv: FakeDriver, root: Path, entries: list[Entry], *, crate: str = "c", package: str = "tripkg",
               jit_fallback: bool = False) -> Any:
    """Write a Triton package of ``entries`` (crate ``crate``; its ``triton.jit_fallback``) and load it."""
    import khal_runtime

    pkg = write_package(root, entries, crate=crate, package=package, language="triton")
    mpath = pkg / "_khal" / "manifest.json"
    m = json.loads(mpath.read_text())
    if jit_fallback:
        m["crates"][0]["triton"] = {"jit_fallback": True}
    mpath.write_text(json.dumps(m))
    for ptx in (pkg / "_khal" / crate).glob("*.ptx"):
        drv.layouts.update({f"FUNC:{n}": lay for n, lay in ptx_param_layouts(ptx.read_bytes()).items()})
    return khal_runtime.load(pkg)


def symbol_of(ks: Any, entry: Entry, crate: str = "c") -> str:
    """The fake driver's name of ``entry``'s function (what ``launches[i]["f"]`` says)."""
    return f"FUNC:{entry.symbol}"


def slots(launch: dict[str, Any]) -> list[int]:
    """A launch's parameter values as ints (little-endian bytes)."""
    return [int.from_bytes(s, "little") for s in launch["slots"]]


class Tensor:
    """A device array Triton's way: ``data_ptr()`` and a torch-like ``dtype`` (``torch.float32``)."""

    def __init__(self, ptr: int, dtype: str = "float32") -> None:
        self._ptr = ptr
        self.dtype = _DTYPES.setdefault(dtype, _Dtype(dtype))

    def data_ptr(self) -> int:
        return self._ptr

    is_cuda = True


class _Dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


_DTYPES: dict[str, _Dtype] = {}
