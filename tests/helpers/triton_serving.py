"""Packages whose host code is written as Triton code, served by khal (tests of
``khal_runtime.triton_serve`` and the stand-in), on the fake driver, without a build.

:func:`write_served_package` writes a package ``<name>/`` whose ``ops.py`` is Triton host code as a
library writes it (``import triton``, ``@triton.jit``, ``kernel[grid](..., BLOCK=...)``) and whose
manifest has the kernel's variants with ``module`` / ``qualname`` set, as a build makes them.

Until ``khal_runtime.triton_call.TritonFunction`` (notes/triton-jit.md) is in the tree,
:class:`StandInFunction` plays it: ``CrateKernels.triton_functions()`` keyed by (module, qualname),
whose call binds Triton's call (every parameter positional or keyword, the options, a callable grid
given the meta dict) and launches the crate's instance family for it. With the real one present,
:func:`use_standin_functions` does nothing and the tests run against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from khal_runtime import abi
from khal_runtime.manifest import Entry, Param, TritonFacts, TritonParam
from tests.helpers.fakecuda import CONTENT, write_package

ROOT = Path(__file__).resolve().parents[2]
HIDE = ROOT / "tests" / "helpers" / "hide"

_U64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
_SCALARS = {"i32": ("int32", 4), "fp32": ("float32", 4), "i64": ("int64", 8)}

#: the kernel of the served packages: add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr), built with
#: BLOCK=256 as its as-written variant (pointers aligned, n divisible by 16) and its conservative twin
NAMES = ("x_ptr", "y_ptr", "out_ptr", "n")
TYPES = ("*fp32", "*fp32", "*fp32", "i32")

OPS = '''\
import triton
import triton.language as tl
from triton.language.extra.libdevice import rsqrt  # a device function: only kernels use it

HAS_TRITON_AT_IMPORT = None


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + rsqrt(y), mask=mask)


def add(x, y, out, n):
    """The host code: a Triton launch, as written for Triton's JIT."""
    add_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256, num_warps=4)


def add_by_meta(x, y, out, n):
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
    add_kernel[grid](x_ptr=x, y_ptr=y, out_ptr=out, n=n, BLOCK=256)
'''


def entry(name: str, divisible: tuple[str, ...], *, module: str | None, qualname: str | None = "add_kernel",
          kernel: str = "add_kernel", content: str = CONTENT, heuristics: tuple[str, ...] = ()) -> Entry:
    """A variant of ``add_kernel`` hashed as a build hashes it, importable as ``module.qualname``."""
    params = tuple(TritonParam(name=n) for n in NAMES) + (TritonParam(name="BLOCK", constexpr=True),)
    facts = TritonFacts(kernel=kernel, family=kernel, base=not divisible, num_warps=4, num_stages=3, shared=0,
                        names=NAMES, types=TYPES, divisible=divisible, constexprs={"BLOCK": 256}, cache_key="ck",
                        triton_version="3.6.0", params=params, module=module,
                        qualname=qualname if module else None, heuristics=heuristics)
    plist = []
    for n, t in zip(NAMES, TYPES):
        if t.startswith("*"):
            plist.append(Param(name=n, **_U64))
        else:
            et, size = _SCALARS[t]
            plist.append(Param(name=n, kind="scalar", element_type=et, element_size=size, element_align=size))
    plist += [Param(name="khal_global_scratch", **_U64), Param(name="khal_profile_scratch", **_U64)]
    sig = abi.entry_signature(name, (128, 1, 1), tuple(plist), grid_dims=3, attributes=None, triton=facts.record())
    h = abi.entry_hash(content, sig)
    return Entry(name=name, symbol=abi.symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=tuple(plist),
                 grid_dims=3, triton=facts)


def entries(module: str | None, qualname: str = "add_kernel", heuristics: tuple[str, ...] = ()) -> list[Entry]:
    """The as-written variant and its conservative twin (``heuristics``: the constexprs the kernel's
    ``@triton.heuristics`` compute)."""
    return [entry(qualname, ("x_ptr", "y_ptr", "out_ptr", "n"), module=module, qualname=qualname,
                  kernel=qualname, heuristics=heuristics),
            entry(f"{qualname}__base", (), module=module, qualname=qualname, kernel=qualname, heuristics=heuristics)]


def write_served_package(root: Path, name: str, *, ops: str = OPS, init: str | None = None,
                         module: str | None = None, serves: dict[str, Any] | None = None,
                         kernel_package: str | None = None, qualname: str = "add_kernel",
                         heuristics: tuple[str, ...] = ()) -> Path:
    """Write ``root/<name>/``: ``__init__.py`` (default: ``kernels = khal_runtime.load(__name__)``),
    ``ops.py`` (Triton host code) and a manifest serving ``<module>.<qualname>`` (default
    ``<name>.ops.add_kernel``); ``serves``: the crate's ``triton.serves`` (a companion). ``kernel_package``:
    write the kernels' package under another name (a companion's) and ``ops`` nowhere."""
    pkg_name = kernel_package or name
    module = module or f"{name}.ops"
    pkg = write_package(root, entries(module, qualname, heuristics), package=pkg_name, language="triton")
    manifest_path = pkg / "_khal" / "manifest.json"
    if serves is not None:
        data = json.loads(manifest_path.read_text())
        data["crates"][0]["triton"] = {"serves": serves}
        manifest_path.write_text(json.dumps(data))
    (pkg / "__init__.py").write_text(init if init is not None else
                                     "import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n")
    if kernel_package is None:
        (pkg / "ops.py").write_text(ops)
    return pkg


# --- a stand-in for rtcall's TritonFunction --------------------------------------------------------

_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "stream")


class StandInFunction:
    """``TritonFunction`` as notes/triton-jit.md describes it, reduced to what these tests launch:
    Triton's call bound by the kernel's parameters, heuristics from the adopted host, the grid
    callable given the meta dict, then the crate's instance family launched with the runtime
    arguments (refused when the constexprs or options differ from the family's)."""

    def __init__(self, family: Any, facts: TritonFacts, crate: str) -> None:
        self.family = family
        self.name = facts.qualname or facts.kernel
        self.crate = crate
        self.module = facts.module
        self.qualname = facts.qualname
        self.params = [p.name for p in facts.params]
        self.host: Any = None
        self.calls: list[dict[str, Any]] = []

    def adopt_host(self, obj: Any) -> None:
        self.host = obj

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
        bound = dict(zip(self.params, args))
        bound.update(kwargs)
        obj = self.host
        while obj is not None and hasattr(obj, "fn"):  # heuristics, outermost first
            for k, fn in getattr(obj, "values", {}).items():
                bound[k] = fn(bound)
            obj = obj.fn
        self.calls.append(dict(bound, **options))
        for k, v in self.family.constexprs.items():
            if bound.get(k) != v:
                raise ValueError(f"{self.name}: {k}={bound.get(k)!r}, built for {v!r}")
        if options.get("num_warps", 4) != 4:
            raise ValueError(f"{self.name}: num_warps={options['num_warps']}, built for 4")
        g = grid(bound) if callable(grid) else grid
        self.family[g](*(bound[n] for n in self.family.arg_names), stream=options.get("stream"))


def _standin_triton_functions(self: Any) -> dict[tuple[str, str], Any]:
    made = self.__dict__.get("_standin_functions")
    if made is None:
        made = {}
        for fam in self._kernels.values():
            facts = fam.entry.triton
            if facts.module and facts.qualname:
                made[(facts.module, facts.qualname)] = StandInFunction(fam, facts, self.name)
        self.__dict__["_standin_functions"] = made
    return made  # type: ignore[no-any-return]


def use_standin_functions() -> bool:
    """Give ``CrateKernels`` the stand-in ``triton_functions`` where it has none (True when it did)."""
    from khal_runtime.kernels import CrateKernels

    if hasattr(CrateKernels, "triton_functions"):
        return False
    CrateKernels.triton_functions = _standin_triton_functions  # type: ignore[attr-defined]
    return True


def drop_standin_functions() -> None:
    from khal_runtime.kernels import CrateKernels

    if getattr(CrateKernels, "triton_functions", None) is _standin_triton_functions:
        del CrateKernels.triton_functions  # type: ignore[attr-defined]


def reset_serving() -> None:
    """Forget every served module and take the finder out (tests only)."""
    from khal_runtime import triton_serve

    with triton_serve._lock:
        triton_serve._served.clear()
        triton_serve._by_module.clear()
        triton_serve._scoped.clear()
        triton_serve._packages.clear()
        triton_serve._visible.clear()
        if triton_serve._FINDER in sys.meta_path:
            sys.meta_path.remove(triton_serve._FINDER)


# --- a process of its own on the fake driver --------------------------------------------------------

#: the prologue of :func:`run_fake`'s scripts: the fake driver as the CUDA backend's, layouts from
#: every PTX file under the packages' root
PROLOGUE = '''\
import os, sys
from pathlib import Path
os.environ["KHAL_BACKEND"] = "cuda"
from tests.helpers import fakecuda
from tests.helpers.triton_serving import use_standin_functions
from khal_runtime import device
from khal_runtime.backends.cuda import driver as cuda_driver
drv = fakecuda.FakeDriver()
cuda_driver._driver = drv
fakecuda._reset_runtime()
device.Device(0).default_stream
device.ensure_current(0)
for ptx in Path(sys.argv[1]).rglob("*.ptx"):
    drv.layouts.update({f"FUNC:{n}": l for n, l in fakecuda.ptx_param_layouts(ptx.read_bytes()).items()})
use_standin_functions()
drv.calls.clear()
'''


def run_fake(root: Path, script: str, *, hide_triton: bool, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (after :data:`PROLOGUE`) in a new Python with ``root`` on ``sys.path``, with
    Triton installed or looking not installed (``KHAL_TEST_HIDE=triton``)."""
    e = dict(os.environ)
    e.pop("KHAL_TEST_HIDE", None)
    paths = [str(HIDE)] if hide_triton else []
    e["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), str(root)])
    if hide_triton:
        e["KHAL_TEST_HIDE"] = "triton"
    e.update(env or {})
    code = PROLOGUE + textwrap.dedent(script)
    proc = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=e,
                          cwd=root, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"the script failed ({proc.returncode}):\n--- stdout ---\n{proc.stdout[-6000:]}\n"
                             f"--- stderr ---\n{proc.stderr[-6000:]}")
    return proc


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
