"""Section 3, load: a fresh process doing import + first launch of the example package from
cubin (no JIT, no NVRTC at run time), the same with the PTX path forced (a copy of the package
whose manifest lists only the PTX), and CuPy RawModule compiling the same translation unit with
its kernel cache empty and warm. Reported in ms (median of a few fresh processes)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, Row, crate_unit, env_with_path, guarded

SECTION = "load"

KHAL_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import example_shader_pkg as e
t1 = time.perf_counter()
import numpy as np
from khal_runtime import DeviceBuffer
x = DeviceBuffer.zeros(1024); y = DeviceBuffer.zeros(1024)
t2 = time.perf_counter()
e.kernels.saxpy(e.elementwise_threads(1024), x, y, e.SaxpyParams(a=2.0))
y.to_numpy()
t3 = time.perf_counter()
nvrtc = any(m.startswith("cuda.bindings.nvrtc") or m.startswith("cupy") for m in sys.modules)
art = e.kernels.saxpy._crate.module(0).artifact
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "context_alloc_ms": (t2 - t1) * 1e3,
                  "first_launch_ms": (t3 - t2) * 1e3, "total_ms": (t3 - t0) * 1e3,
                  "nvrtc_imported": nvrtc, "artifact": f"{art.kind} {art.arch}"}))
"""

CUPY_CHILD = r"""
import json, sys, time
src, name, opts = json.load(open(sys.argv[1]))
t0 = time.perf_counter()
import cupy as cp
import numpy as np
x = cp.zeros(1024, cp.float32); y = cp.zeros(1024, cp.float32)
t1 = time.perf_counter()
mod = cp.RawModule(code=src, options=tuple(opts))
k = mod.get_function(name)
t2 = time.perf_counter()
p = cp.asarray(np.array([2.0], np.float32))
k((1,), (256,), (x, np.uint64(1024), y, np.uint64(1024), p))
cp.cuda.runtime.deviceSynchronize()
t3 = time.perf_counter()
print(json.dumps({"import_ctx_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3,
                  "first_launch_ms": (t3 - t2) * 1e3, "total_ms": (t3 - t0) * 1e3}))
"""


def _child(code: str, env: dict[str, str], *argv: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode:
        tail = (r.stderr or r.stdout).strip().splitlines()
        raise RuntimeError(tail[-1] if tail else f"exit {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[-1])
    for k, v in runs[0].items():
        if isinstance(v, float):
            out[k] = statistics.median(r[k] for r in runs)
    return out


def _ptx_only_copy(pkg_dir: Path, dest: Path) -> Path:
    from khal_runtime.manifest import MANIFEST_DIR, MANIFEST_NAME, load_manifest

    target = dest / "example_shader_pkg"
    shutil.copytree(pkg_dir, target)
    mpath = target / MANIFEST_DIR / MANIFEST_NAME
    man = load_manifest(mpath)
    crates = tuple(c.model_copy(update={"artifacts": tuple(a for a in c.artifacts if a.kind == "ptx")})
                   for c in man.crates)
    mpath.write_text(man.model_copy(update={"crates": crates}).to_json())
    return dest


def run(args: Any) -> list[Row]:
    import importlib

    rows: list[Row] = []
    site = [args.site] if args.site else []
    env = env_with_path([str(ROOT)] + site)
    reps = 3
    ex = importlib.import_module("example_shader_pkg")
    pkg_dir = Path(ex.__file__).parent

    def cubin() -> None:
        r = _median([_child(KHAL_CHILD, env) for _ in range(reps)])
        ok = not r["nvrtc_imported"] and r["artifact"].startswith("cubin")
        rows.append(Row(SECTION, "khal import + first launch (cubin)", r["total_ms"], "ms", None, "", "no JIT, no NVRTC",
                        ok, f"import {r['import_ms']:.0f} ms, ctx+alloc {r['context_alloc_ms']:.0f} ms, "
                            f"first launch {r['first_launch_ms']:.1f} ms ({r['artifact']})", extra=r))

    def ptx() -> None:
        tmp = Path(tempfile.mkdtemp(prefix="khal-ptx-"))
        penv = env_with_path([str(ROOT), str(_ptx_only_copy(pkg_dir, tmp))] + site)
        r = _median([_child(KHAL_CHILD, penv) for _ in range(reps)])
        rows.append(Row(SECTION, "khal import + first launch (PTX forced)", r["total_ms"], "ms", note=
                        f"first launch {r['first_launch_ms']:.1f} ms ({r['artifact']}, driver JIT)", extra=r))
        shutil.rmtree(tmp, ignore_errors=True)

    def cupy() -> None:
        from hatch_khal.config import parse_config

        try:
            import tomllib
        except ImportError:  # pragma: no cover
            import tomli as tomllib  # type: ignore[no-redef]
        proj = ROOT / "example_shader_pkg"
        raw = tomllib.loads((proj / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["khal"]
        _, crates = parse_config(raw, default_package="example_shader_pkg")
        core = next(c for c in crates if c.name == "core")
        text, opts = crate_unit(proj, core)
        man_sym = ex.kernels.saxpy.entry.symbol
        # the unit's saxpy must be the installed one (same source, same hash)
        if man_sym not in text:
            raise RuntimeError("the installed example package does not match the source tree")
        tmp = Path(tempfile.mkdtemp(prefix="khal-cupy-"))
        spec = tmp / "unit.json"
        spec.write_text(json.dumps([text, man_sym, [o for o in opts if o.startswith(("-I", "-D", "-std"))]]))
        cenv = dict(env, CUPY_CACHE_DIR=str(tmp / "cache"))
        cold = []
        for i in range(reps):
            shutil.rmtree(tmp / "cache", ignore_errors=True)
            cold.append(_child(CUPY_CHILD, cenv, str(spec)))
        r = _median(cold)
        rows.append(Row(SECTION, "CuPy RawModule, cache empty", r["total_ms"], "ms",
                        note=f"compile {r['compile_ms']:.0f} ms", extra=r))
        r = _median([_child(CUPY_CHILD, cenv, str(spec)) for _ in range(reps)])
        rows.append(Row(SECTION, "CuPy RawModule, cache warm", r["total_ms"], "ms",
                        note=f"compile (cache hit) {r['compile_ms']:.0f} ms", extra=r))
        shutil.rmtree(tmp, ignore_errors=True)

    guarded(SECTION, "khal import + first launch (cubin)", rows, cubin)
    guarded(SECTION, "khal import + first launch (PTX forced)", rows, ptx)
    guarded(SECTION, "CuPy RawModule", rows, cupy)
    return rows
