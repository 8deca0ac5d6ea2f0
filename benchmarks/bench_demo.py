"""Section 5, the particle demos: steps/s of one particle step done three ways, checked against
the NumPy reference by the demos themselves (a wrong result is an error row, never a figure).

* the CUDA C++ crate (``example_shader_pkg.demo_cuda``): direct launches with a host-read
  indirect dispatch, device-side indirect dispatch, one captured graph per step;
* the Slang crate on CUDA and on WebGPU (``example_shader_pkg.demo``): direct (alive count read
  on the host), indirect (device-side count), graph (CUDA graph / WebGPU recorded replay). The
  WebGPU rows run in a process of their own (the backend is chosen once per process).

Ratios are to the same crate and backend's direct mode.
"""

from __future__ import annotations

from typing import Any

from _common import Row, guarded

SECTION = "demo"
MODES = ("direct", "indirect", "graph")


def _rows(label: str, bench: Any, rows: list[Row], steps: int, **kw: Any) -> None:
    res: dict[str, float] = {}
    for mode in MODES:
        def one(mode: str = mode) -> None:
            r = bench(mode, steps=steps, **kw)
            v = float(r["steps_per_s"])
            res[mode] = v
            base = res.get("direct")
            rows.append(Row(SECTION, f"{label}, {mode}", v, "steps/s", v / base if base else None,
                            "direct", note=str(r.get("device", "")), extra=r))
        guarded(SECTION, f"{label}, {mode}", rows, one)


def run(args: Any) -> list[Row]:
    rows: list[Row] = []
    try:
        from example_shader_pkg import demo, demo_cuda  # type: ignore[attr-defined]
    except ImportError as exc:
        return [Row(SECTION, "particle demo", note=f"not available: example_shader_pkg.demo ({exc})")]
    _rows("C++ particle step (CUDA)", demo_cuda.benchmark, rows, args.demo_steps)
    _rows("Slang particle step, CUDA", demo.benchmark, rows, args.demo_steps, backend="cuda")
    _rows("Slang particle step, WebGPU", demo.benchmark, rows, args.demo_steps, backend="webgpu")
    return rows
