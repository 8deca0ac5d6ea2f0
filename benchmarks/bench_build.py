"""Section 6 (CPU, no GPU needed), build: the example package through the hook.

* cold wheel build (empty compile cache), warm rebuild, rebuild after touching one header
  (``pip wheel --no-build-isolation``, wall time; hook time and compile counts from the
  builder run in-process on the same project and cache);
* scaling with the number of archs (1, 4, all NVRTC supports) and of crates (core alone, all);
* each crate alone, default archs + PTX, cold (empty cache) and warm: the CUDA C++ crates beside
  the Slang crate (whose cold build runs the Slang stage, then NVRTC on its unit), plus the Slang
  stage's own times (session, CUDA source, WGSL / SPIR-V per entry) and the Slang crate with
  ``KHAL_SKIP_SPIRV``;
* NVRTC (the hook, parallel) vs nvcc compiling the hook's own translation units of the CUDA C++ crates
  (hatch_khal.codegen.generate_unit) for the same archs with ``-cubin``, serial and parallel.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from _common import ROOT, Row, crate_unit, guarded

SECTION = "build"
FOUR_ARCHS = ["sm_75", "sm_80", "sm_89", "sm_90"]


def _crates(proj: Path) -> list[Any]:
    from hatch_khal.config import parse_config

    try:
        import tomllib
    except ImportError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    raw = tomllib.loads((proj / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["khal"]
    return parse_config(raw, default_package="example_shader_pkg")[1]


def _inproc(proj: Path, cache_dir: Path | None, crates: list[Any] | None = None) -> Any:
    from hatch_khal.builder import PrintReporter, build_packages
    from hatch_khal.cache import Cache

    class Quiet(PrintReporter):
        def info(self, message: str) -> None:
            pass

        def debug(self, message: str) -> None:
            pass

        def warn(self, message: str) -> None:
            pass

    cache = Cache(cache_dir, lambda m: None) if cache_dir else Cache(None)
    return build_packages(proj, crates if crates is not None else _crates(proj), Quiet(), cache=cache)


@contextlib.contextmanager
def _cubins_only(archs: list[str]) -> Iterator[None]:
    """Build these cubin archs and no PTX (KHAL_CUDA_ARCHS / KHAL_PTX_ARCH) for the block."""
    os.environ["KHAL_CUDA_ARCHS"] = ",".join(archs)
    os.environ["KHAL_PTX_ARCH"] = "none"
    try:
        yield
    finally:
        os.environ.pop("KHAL_CUDA_ARCHS", None)
        os.environ.pop("KHAL_PTX_ARCH", None)


def _wheel(proj: Path, out: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(proj)], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:  # the build's error block (hatch_khal.report), whole
        raise RuntimeError((r.stderr or r.stdout).strip()[-3000:])
    return time.perf_counter() - t0


def run(args: Any) -> list[Row]:
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="khal-build-bench-"))
    proj = work / "example_shader_pkg"
    shutil.copytree(ROOT / "example_shader_pkg", proj, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    cache = work / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_"))}
    env["KHAL_CACHE_DIR"] = str(cache)
    # this environment's NVRTC may be newer than the example's nvrtc-requirement (hatch_khal.nvrtc.ptx_problem)
    env["KHAL_NVRTC_ANY_MINOR"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_"))}
    res: dict[str, Any] = {}
    try:
        def cold() -> None:
            res["cold"] = _wheel(proj, work / "w1", env)
            rows.append(Row(SECTION, "cold wheel build (empty cache)", res["cold"], "s", 1.0, "cold build"))

        def warm() -> None:
            w = _wheel(proj, work / "w2", env)
            r = _inproc(proj, cache)
            share = r.seconds / res["cold"] if "cold" in res else None
            ok = r.compiled == 0 and share is not None and share < 0.10
            rows.append(Row(SECTION, "warm rebuild (wheel)", w, "s", w / res["cold"] if "cold" in res else None,
                            "cold build", "compiles nothing; hook < 10% of cold", ok,
                            f"hook {r.seconds * 1e3:.0f} ms = {100 * (share or 0):.1f}% of cold; compiled "
                            f"{r.compiled}, cached {r.cached}"))

        def touched() -> None:
            hdr = proj / "kernels" / "include" / "params.cuh"
            hdr.write_text(hdr.read_text() + f"\n// touched {time.time()}\n")
            w = _wheel(proj, work / "w3", env)
            hdr.write_text(hdr.read_text() + f"// touched again {time.time()}\n")
            r = _inproc(proj, cache)  # the same change again, in-process: what it recompiles
            rows.append(Row(SECTION, "rebuild after touching params.cuh (wheel)", w, "s",
                            w / res["cold"] if "cold" in res else None, "cold build",
                            note=f"recompiles {r.compiled} of {r.compiled + r.cached} (the crates including it), "
                                 f"hook {r.seconds:.1f} s"))

        guarded(SECTION, "cold wheel build", rows, cold)
        guarded(SECTION, "warm rebuild", rows, warm)
        guarded(SECTION, "touched header", rows, touched)

        from hatch_khal.nvrtc import supported_archs

        all_archs = [f"sm_{a}" for a in supported_archs()]
        crates_all = _crates(proj)

        def archs_scaling() -> None:
            with _cubins_only(["sm_90"]):
                _inproc(proj, None, _crates(proj))  # warm-up: compile workers, file cache
            base = None
            for label, archs in (("1 arch", ["sm_90"]), ("4 archs", FOUR_ARCHS), (f"all {len(all_archs)} archs", all_archs)):
                with _cubins_only(archs):
                    r = _inproc(proj, None, _crates(proj))
                base = base or r.seconds
                rows.append(Row(SECTION, f"hook cold, {label}, all crates", r.seconds, "s", r.seconds / base,
                                "1 arch", note=f"{r.compiled} compiles"))
                res[f"hook_{len(archs)}"] = (r.seconds, archs)

        def crates_scaling() -> None:
            with _cubins_only(["sm_90"]):
                base = None
                for label, only in (("crate core", "core"), (f"all {len(crates_all)} crates", None)):
                    cs = [c for c in _crates(proj) if only is None or c.name == only]
                    r = _inproc(proj, None, cs)
                    base = base or r.seconds
                    rows.append(Row(SECTION, f"hook cold, sm_90, {label}", r.seconds, "s", r.seconds / base,
                                    "core only", note=f"{r.compiled} compiles"))

        def per_crate() -> None:
            # Every crate alone with every default arch + PTX: cold (empty cache: CUDA C++ parsed
            # once per arch, archs in parallel; a Slang crate runs its stage first), then warm.
            for c in _crates(proj):
                cache = Path(tempfile.mkdtemp(prefix=f"khal-bench-{c.name}-"))
                try:
                    cold_r = _inproc(proj, cache, [c])
                    warm_r = _inproc(proj, cache, [c])
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
                what = "Slang" if c.language == "slang" else "CUDA C++"
                targets = f"{len(c.archs)} archs + PTX"
                stage = " (1 Slang stage + NVRTC per target)" if c.language == "slang" else ""
                rows.append(Row(SECTION, f"crate '{c.name}' ({what}), default archs + PTX, cold", cold_r.seconds, "s",
                                1.0, "cold", note=f"{cold_r.compiled} compiles{stage}, {targets}"))
                rows.append(Row(SECTION, f"crate '{c.name}' ({what}), default archs + PTX, warm", warm_r.seconds, "s",
                                warm_r.seconds / cold_r.seconds, "cold",
                                note=f"{warm_r.compiled} compiles, {warm_r.cached} from cache"))

        def slang_stage() -> None:
            # The Slang stage alone (one worker process), and the crate without its WebGPU stage.
            from hatch_khal.slang.language import SLANG
            from hatch_khal.slang.stage import compile_slang_crate

            cs = [c for c in _crates(proj) if c.language == "slang"]
            if not cs:
                raise RuntimeError("the example has no Slang crate")
            plan = SLANG.plan(proj, cs[0]).plan
            out = compile_slang_crate(plan.slang, plan.targets)
            t = out.timings
            webgpu = sum(v for k, v in t.items() if k.endswith((".wgsl", ".spirv")))
            n = len(out.entries)
            rows.append(Row(SECTION, f"Slang stage alone, crate '{cs[0].name}' ({n} entries, CUDA + WGSL + SPIR-V)",
                            t.get("worker", 0.0), "s", note=f"session {t.get('session', 0):.2f} s, CUDA source "
                            f"{t.get('cuda', 0):.2f} s, WGSL + SPIR-V {webgpu:.2f} s ({webgpu / max(1, 2 * n) * 1e3:.0f} "
                            "ms per entry per target)"))
            os.environ["KHAL_SKIP_SPIRV"] = "1"
            cache = Path(tempfile.mkdtemp(prefix="khal-bench-skip-"))
            try:
                r = _inproc(proj, cache, cs)
            finally:
                os.environ.pop("KHAL_SKIP_SPIRV", None)
                shutil.rmtree(cache, ignore_errors=True)
            rows.append(Row(SECTION, f"crate '{cs[0].name}' (Slang) with KHAL_SKIP_SPIRV, cold", r.seconds, "s",
                            note=f"{r.compiled} compiles: no WGSL / SPIR-V"))

        def nvcc_vs_nvrtc() -> None:
            nvcc = shutil.which("nvcc") or "/usr/local/bin/nvcc"
            if not Path(nvcc).exists():
                raise RuntimeError("nvcc not found")
            archs = FOUR_ARCHS
            units = []
            udir = work / "nvcc"
            udir.mkdir(exist_ok=True)
            cuda_crates = [c for c in _crates(proj) if c.language == "cuda"]  # nvcc compiles CUDA C++ only
            for c in cuda_crates:
                text, opts = crate_unit(proj, c)
                f = udir / f"{c.name}.khal.cu"
                f.write_text(text)
                keep = [o for o in opts if o.startswith(("-I", "-D", "-std"))]
                # nvcc brings its own CUDA/CCCL headers and <stdint.h>: drop the PyPI wheels'
                # include dirs and khal.h's NVRTC-only typedefs
                keep = [o for o in keep if not ("site-packages" in o and "nvidia" in o)]
                keep += ["-DKHAL_NO_STDINT", "-include", "cstdint"]
                units.append((c.name, f, keep))
            cmds = [[nvcc, "-cubin", f"-arch={a}", *opts, str(f), "-o", str(udir / f"{name}.{a}.cubin")]
                    for name, f, opts in units for a in archs]

            def one(cmd: list[str]) -> None:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
                if r.returncode:
                    raise RuntimeError(f"nvcc failed: {(r.stderr or r.stdout).strip()[:300]}")

            t0 = time.perf_counter()
            for cmd in cmds:
                one(cmd)
            serial = time.perf_counter() - t0
            t0 = time.perf_counter()
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                list(pool.map(one, cmds))
            par = time.perf_counter() - t0
            with _cubins_only(archs):  # parsed inside: the archs come from the environment
                hook = _inproc(proj, None, [c for c in _crates(proj) if c.language == "cuda"])
            n = len(cmds)
            rows.append(Row(SECTION, f"hook (NVRTC, parallel), {n} cubins", hook.seconds, "s", 1.0, "hook",
                            note=f"{hook.compiled} compiles, {len(units)} crates x {len(archs)} archs"))
            rows.append(Row(SECTION, f"nvcc -cubin serial, same {n} units", serial, "s", serial / hook.seconds,
                            "hook"))
            rows.append(Row(SECTION, f"nvcc -cubin parallel ({os.cpu_count()} jobs)", par, "s",
                            par / hook.seconds, "hook"))

        guarded(SECTION, "archs scaling", rows, archs_scaling)
        guarded(SECTION, "crates scaling", rows, crates_scaling)
        guarded(SECTION, "each crate cold/warm", rows, per_crate)
        guarded(SECTION, "Slang stage", rows, slang_stage)
        guarded(SECTION, "nvcc vs NVRTC", rows, nvcc_vs_nvrtc)
    finally:
        os.environ.update(saved)
        shutil.rmtree(work, ignore_errors=True)
    return rows
