"""hatch-khal benchmarks: one runner, every comparison in the same process and run, as ratios.

    python benchmarks/run.py [--only launch,pycost,graph,load,kernels,demo,torch,attrs,triton,webgpu,build]
                             [--json results.json] [--site DIR]

GPU sections (launch, graph, load, kernels, demo, torch) are skipped, saying why, without a usable
CUDA GPU; CPU sections (pycost, build) run anywhere. The webgpu section runs wherever wgpu-py
finds a WebGPU adapter (on a CPU machine, Mesa's lavapipe: then its figures are CPU figures and
it says so), in a process of its own with KHAL_BACKEND=webgpu (the backend is chosen once per
process and the CUDA sections run here first); without an adapter it is skipped, saying why.
Each row that fails prints its error in the table and the others go on. The table comes last;
the JSON has every figure. Exit status: 0 when every bar is met and no row failed, 1 when a bar
was missed or a row failed (so the bars in DESIGN.md are enforced wherever this runs), 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GPU_SECTIONS = ("launch", "graph", "load", "kernels", "demo", "torch", "attrs", "triton")
CPU_SECTIONS = ("pycost", "build")
#: runs on any WebGPU adapter (a GPU, or lavapipe on the CPU), in a subprocess; skips itself
WEBGPU_SECTIONS = ("webgpu",)
ALL = ("pycost", "launch", "graph", "load", "kernels", "demo", "torch", "attrs", "triton", "webgpu", "build")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(ALL), help="comma list of sections (default: all)")
    ap.add_argument("--skip", default="", help="comma list of sections to leave out")
    ap.add_argument("--json", default="benchmarks/results.json", help="where to write every figure")
    ap.add_argument("--site", default=os.environ.get("KHAL_BENCH_SITE", ""),
                    help="directory holding the installed/unpacked example wheel (put first on sys.path)")
    ap.add_argument("--calls", type=int, default=200, help="launches per timed batch")
    ap.add_argument("--batches", type=int, default=60, help="timed batches (median taken)")
    ap.add_argument("--kernel-elems", type=int, default=1 << 28, help="floats per buffer in 'kernels'")
    ap.add_argument("--kernel-reps", type=int, default=20)
    ap.add_argument("--demo-steps", type=int, default=200)
    ap.add_argument("--webgpu-dispatches", type=int, default=1000,
                    help="webgpu: dispatches per timed batch (one submit each batch)")
    ap.add_argument("--webgpu-mb", type=int, default=0,
                    help="webgpu: MiB per buffer in the bandwidth rows (default 256; 16 on a CPU adapter)")
    ap.add_argument("--webgpu-package", default=os.environ.get("KHAL_BENCH_WEBGPU_PACKAGE", ""),
                    help="webgpu: the kernels' package prebuilt with 'bench_webgpu.py --build-only DIR' "
                         "(where slangpy is missing, e.g. the lent H200)")
    ap.add_argument("--webgpu-timeout", type=int, default=900, help="webgpu: seconds before its process is stopped")
    return ap.parse_args(argv)


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def table(rows: list) -> str:
    head = ("section", "benchmark", "value", "unit", "ratio", "vs", "bar", "ok", "note")
    lines = [[r.section, r.name, _fmt(r.value), r.unit, _fmt(r.ratio), r.ref, r.bar,
              {True: "yes", False: "NO", None: ""}[r.ok], r.note] for r in rows]
    widths = [max(len(head[i]), *(len(l[i]) for l in lines)) if lines else len(head[i]) for i in range(8)]
    out = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(head[:8])) + "  note"]
    out.append("-" * (sum(widths) + 2 * 8 + 4))
    for l in lines:
        out.append("  ".join(l[i].ljust(widths[i]) for i in range(8)) + "  " + l[8])
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # khal_runtime / hatch_khal from this checkout (the code under test) first, then --site
    # (the installed example wheel); the checkout's example_shader_pkg/ project directory has
    # no __init__.py, so the installed package is the one imported.
    root = str(HERE.parent)
    if root in sys.path:
        sys.path.remove(root)
    sys.path.insert(1, root)
    if args.site:
        sys.path.insert(2, os.path.abspath(args.site))
    from _common import Row, device_info, error_row, gpu_status

    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    wanted = [s for s in wanted if s not in {x.strip() for x in args.skip.split(",")}]
    unknown = [s for s in wanted if s not in ALL]
    if unknown:
        print(f"unknown section(s): {', '.join(unknown)}; choose from {', '.join(ALL)}", file=sys.stderr)
        return 2
    gpu_ok, why = gpu_status()
    rows: list[Row] = []
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "python": sys.version.split()[0],
            "platform": platform.platform(), "gpu_usable": gpu_ok, "gpu_reason": why, "sections": wanted}
    if gpu_ok:
        meta.update(device_info())
    for mod_name in ("cuda.bindings", "cuda.core", "cupy", "torch", "numpy"):
        try:
            mod = __import__(mod_name, fromlist=["__version__"])
            meta[f"version:{mod_name}"] = getattr(mod, "__version__", "?")
        except Exception:  # noqa: BLE001
            meta[f"version:{mod_name}"] = None
    modules = {"pycost": ("bench_launch", "run_pycost"), "launch": ("bench_launch", "run"),
               "graph": ("bench_graph", "run"), "load": ("bench_load", "run"),
               "kernels": ("bench_kernels", "run"), "demo": ("bench_demo", "run"), "torch": ("bench_torch", "run"),
               "attrs": ("bench_attrs", "run"), "triton": ("bench_triton", "run"), "webgpu": ("bench_webgpu", "run"),
               "build": ("bench_build", "run")}
    # the sections that will run: webgpu leaves the WebGPU demo rows to the demo section then
    args.sections = [s for s in wanted if gpu_ok or s not in GPU_SECTIONS]
    timings = {}
    for sec in wanted:
        if sec in GPU_SECTIONS and not gpu_ok:
            rows.append(Row(sec, "(section skipped)", note=f"no usable GPU: {why}"))
            print(f"[{sec}] skipped: no usable GPU: {why}", flush=True)
            continue
        print(f"[{sec}] running ...", flush=True)
        t0 = time.perf_counter()
        try:
            mod = __import__(modules[sec][0])
            got = getattr(mod, modules[sec][1])(args)
            rows.extend(got)
        except Exception as exc:  # noqa: BLE001 - one section failing must not lose the others
            rows.append(error_row(sec, "(section failed)", exc))
        timings[sec] = time.perf_counter() - t0
        print(f"[{sec}] done in {timings[sec]:.1f} s", flush=True)
    meta["section_seconds"] = timings
    if "webgpu" in wanted:
        try:
            from bench_webgpu import cross_rows

            rows.extend(cross_rows(rows))
        except Exception as exc:  # noqa: BLE001
            rows.append(error_row("webgpu", "(vs CUDA copy)", exc))
    try:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": [r.as_dict() for r in rows]}, indent=2,
                                              default=str))
        print(f"full results: {args.json}")
    except OSError as exc:
        print(f"could not write {args.json}: {exc}", file=sys.stderr)
    for r in rows:
        tb = r.extra.get("traceback") if isinstance(r.extra, dict) else None
        if tb:
            print(f"--- {r.section} / {r.name}:\n{tb}", file=sys.stderr)
    dev = meta.get("gpu") or ("no GPU" if not gpu_ok else "?")
    print(f"\nhatch-khal benchmarks, {meta['date']}, {dev}, driver CUDA {meta.get('driver_cuda')}, "
          f"Python {meta['python']}")
    print(table(rows))
    missed = [r for r in rows if r.ok is False]
    errors = [r for r in rows if r.note.startswith("ERROR")]
    print(f"\nbars missed: {len(missed)}; errors: {len(errors)}")
    return 1 if missed or errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
