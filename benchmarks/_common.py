"""Shared pieces of the benchmark sections: rows, timing, GPU detection, the launch-bench crate."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass
class Row:
    """One line of the final table (and one record of the JSON)."""

    section: str
    name: str
    value: float | None = None
    unit: str = ""
    ratio: float | None = None  # value / reference (the section says which)
    ref: str = ""  # what ratio is relative to
    bar: str = ""  # the bar, in words (e.g. "<= 1.15")
    ok: bool | None = None  # bar met? None = no bar / not measured
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def error_row(section: str, name: str, exc: BaseException) -> Row:
    tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return Row(section, name, note=f"ERROR: {tb[:300]}", extra={"traceback": traceback.format_exc()})


def guarded(section: str, name: str, rows: list[Row], fn: Callable[[], Any]) -> Any:
    """Run ``fn``; on failure append an error row (the other rows of the section survive)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a benchmark row must never take the run down
        rows.append(error_row(section, name, exc))
        return None


def gpu_status() -> tuple[bool, str]:
    """(usable, why not) via the runtime's own probe."""
    try:
        from khal_runtime.backends.cuda import driver as _cuda

        st = _cuda.status()
        return st.usable, st.reason
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}"


def interleaved_per_call_us(fns: dict[str, Callable[[], Any]], *, calls: int = 200, batches: int = 60,
                            sync: Callable[[], Any] | None = None, warmup: int = 3) -> dict[str, dict[str, float]]:
    """Like :func:`median_per_call_us` for several ways of doing the same launch, measured in
    turns: round r times one batch of each, in an order rotated every round. Clock and power
    drift over the run then weighs on every method alike, so their ratios are fair."""
    names = list(fns)
    per: dict[str, list[float]] = {k: [] for k in names}
    for b in range(warmup + batches):
        order = names[b % len(names):] + names[: b % len(names)]
        for name in order:
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            if sync is not None:
                sync()
            if b >= warmup:
                per[name].append((t1 - t0) / calls * 1e6)
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in per.items()}


def median_per_call_us(fn: Callable[[], Any], *, calls: int = 200, batches: int = 60,
                       sync: Callable[[], Any] | None = None, warmup: int = 3) -> dict[str, float]:
    """Host time per call (us): ``batches`` batches of ``calls`` calls, the device synchronised
    between batches (untimed) so the launch queue never fills. Median and min of the batches."""
    return interleaved_per_call_us({"fn": fn}, calls=calls, batches=batches, sync=sync, warmup=warmup)["fn"]


def device_info() -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        from khal_runtime import Device
        from khal_runtime.backends.cuda import driver as _cuda

        st = _cuda.status()
        out["driver_cuda"] = st.driver_version
        if st.usable:
            d = Device(0)
            out["gpu"] = d.name
            out["compute_capability"] = list(d.compute_capability())
    except Exception as exc:  # noqa: BLE001
        out["error"] = str(exc)
    try:
        import subprocess

        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        if r.returncode == 0:
            out["nvidia_smi"] = r.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return out


def compute_capability() -> tuple[int, int] | None:
    try:
        from khal_runtime.backends.cuda import driver as _cuda
        from khal_runtime.backends.cuda.driver import check

        drv = _cuda.driver()
        if not _cuda.status().usable:
            return None
        dev = check(drv.cuDeviceGet(0), "cuDeviceGet")
        a = drv.CUdevice_attribute
        major = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attr")
        minor = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attr")
        return int(major), int(minor)
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------------------------------------
# The launch-bench crate: an empty 1-binding kernel and a 5-binding kernel
# (3 storage + 1 uniform + 1 scalar), built in-process by the hook's own builder.
# ---------------------------------------------------------------------------------------------
BENCH_PKG = "khal_bench_kernels"
BENCH_SOURCE = r"""// Launch-overhead kernels for benchmarks/bench_launch.py.
#include "khal.h"

struct BenchParams { float a; float b; };

KHAL_ENTRY(empty1, 256, (KHAL_STORAGE(float, x)))
{
}

KHAL_ENTRY(five, 256, (KHAL_STORAGE(const float, x),
                       KHAL_STORAGE(const float, y),
                       KHAL_STORAGE(float, z),
                       KHAL_UNIFORM(BenchParams, p),
                       KHAL_SCALAR(float, s)))
{
    const khal::u64 i = KHAL_GLOBAL_ID;
    if (i < z.len && i < x.len && i < y.len) z[i] = p.a * x[i] + p.b * y[i] + s;
}
"""


@dataclass
class BenchPackage:
    root: Path  # on sys.path
    package_dir: Path
    source_dir: Path
    unit_text: str  # the hook's generated translation unit (what CuPy compiles too)
    unit_options: list[str]  # its NVRTC options (-std, -I ...)
    symbols: dict[str, str]
    arch: str


def build_quietly(proj: Path, crates: Any) -> Any:
    """``hatch_khal``'s builder over ``proj`` with no cache and no progress lines (warnings print)."""
    from hatch_khal.builder import PrintReporter, build_packages
    from hatch_khal.cache import Cache

    class Quiet(PrintReporter):
        def info(self, message: str) -> None:
            pass

    return build_packages(proj, crates, Quiet(), cache=Cache(None))


def build_test_package(proj: Path, package: str) -> tuple[Any, Path]:
    """The test package at ``proj`` (its pyproject's khal hook table) built in-process by
    :func:`build_quietly` into a temporary site, imported: (its ``kernels``, the site)."""
    import importlib

    from hatch_khal.builder import write_package_output
    from hatch_khal.config import parse_config

    try:
        import tomllib
    except ImportError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]

    raw = tomllib.loads((proj / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    _, crates = parse_config(raw["hooks"]["khal"], default_package=package)
    result = build_quietly(proj, crates)
    site = Path(tempfile.mkdtemp(prefix=f"khal-bench-{package}-"))
    pkg_dir = site / package
    pkg_dir.mkdir(parents=True)
    (pkg_dir / "__init__.py").write_text("import khal_runtime\nkernels = khal_runtime.load(__name__)\n")
    for out in result.packages:
        write_package_output(out, pkg_dir)
    sys.path.insert(0, str(site))
    return importlib.import_module(package).kernels, site


def device_complete_us(fn: Callable[[], Any], sync: Callable[[], Any], reps: int, per: int = 1) -> float:
    """Median wall time (us) of ``fn`` followed by ``sync`` (device-complete), divided by ``per``."""
    fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) / per * 1e6)
    return statistics.median(out)


def build_bench_package(archs: list[str] | None = None, where: Path | None = None) -> BenchPackage:
    """Compile the launch-bench crate with hatch_khal's builder into a temporary package."""
    from hatch_khal.builder import write_package_output
    from hatch_khal.config import parse_config

    if archs is None:
        cc = compute_capability()
        archs = [f"sm_{cc[0]}{cc[1]}"] if cc else ["sm_90"]
    base = Path(where or tempfile.mkdtemp(prefix="khal-bench-"))
    proj = base / "project"
    (proj / "kernels").mkdir(parents=True, exist_ok=True)
    (proj / "kernels" / "launch.cu").write_text(BENCH_SOURCE)
    raw = {"archs": archs, "crates": [{"name": "launch", "sources": ["kernels/*.cu"],
                                       "package": BENCH_PKG, "cuda-headers": "none"}]}
    _, crates = parse_config(raw, default_package=BENCH_PKG)

    result = build_quietly(proj, crates)
    site = base / "site"
    pkg_dir = site / BENCH_PKG
    pkg_dir.mkdir(parents=True, exist_ok=True)
    (pkg_dir / "__init__.py").write_text("import khal_runtime\nkernels = khal_runtime.load(__name__)\n")
    for out in result.packages:
        write_package_output(out, pkg_dir)
    from khal_runtime.manifest import load_manifest

    man = load_manifest(pkg_dir / "_khal" / "manifest.json")
    symbols = {e.name: e.symbol for c in man.crates for e in c.entries}
    text, opts = crate_unit(proj, crates[0])
    return BenchPackage(site, pkg_dir, proj / "kernels", text, opts, symbols, archs[0])


def crate_unit(root: Path, cfg: Any) -> tuple[str, list[str]]:
    """(the hook's translation unit, its compile options) for a resolved crate, exactly as
    the builder makes them (so nvcc / CuPy can compile the very same text)."""
    from hatch_khal.cuda import CUDA, CudaFront

    root = root.resolve()
    # the unit with every indirect variant (the bench crates have no wrong one, so it is the unit
    # the build compiles); the unit and options are the same for every arch
    prepared = CUDA.plan(root, cfg).prepared(CudaFront())
    job = prepared.jobs(root, ["compute_75"])[0]
    return job.text, list(job.options)


def generated_unit_text(root: Path, crate: str, sources: list[Path]) -> str:
    from hatch_khal.config import parse_config

    raw = {"crates": [{"name": crate, "sources": [str(p.relative_to(root)) for p in sources],
                       "cuda-headers": "none"}]}
    _, crates = parse_config(raw, default_package="x")
    return crate_unit(root, crates[0])[0]


def import_bench_package(pkg: BenchPackage) -> Any:
    if str(pkg.root) not in sys.path:
        sys.path.insert(0, str(pkg.root))
    import importlib

    return importlib.import_module(BENCH_PKG)


def bench_kernels_on_device0() -> tuple[Any, Any]:
    """(the bench package's kernels, device 0's runtime stream), device 0 made current."""
    from khal_runtime import Device

    ks = import_bench_package(build_bench_package()).kernels
    dev = Device(0)
    dev.use()
    return ks, dev.default_stream


def env_with_path(extra: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    parts = [p for p in extra if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env
