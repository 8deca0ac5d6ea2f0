"""Section 5, the particle demo (example_shader_pkg/demo.py): steps/s for direct launches,
device-side indirect dispatch and a captured graph, if the demo offers a benchmark entry.

Looks for ``demo.benchmark(mode, steps=...)`` returning steps/s (or a dict with
``steps_per_s``) for mode in direct / indirect / graph; anything else is reported as
not available rather than guessed at."""

from __future__ import annotations

from typing import Any

from _common import Row, guarded

SECTION = "demo"
MODES = ("direct", "indirect", "graph")


def run(args: Any) -> list[Row]:
    rows: list[Row] = []
    try:
        from example_shader_pkg import demo  # type: ignore[attr-defined]
    except ImportError as exc:
        return [Row(SECTION, "particle demo", note=f"not available: example_shader_pkg.demo ({exc})")]
    bench = getattr(demo, "benchmark", None)
    if bench is None:
        return [Row(SECTION, "particle demo", note="not available: demo.py has no benchmark(mode, steps=...)")]
    res: dict[str, float] = {}
    for mode in MODES:
        def one(mode: str = mode) -> None:
            r = bench(mode, steps=args.demo_steps)
            v = float(r["steps_per_s"] if isinstance(r, dict) else r)
            res[mode] = v
            base = res.get("direct")
            rows.append(Row(SECTION, f"particle demo, {mode}", v, "steps/s", v / base if base else None,
                            "direct", extra=r if isinstance(r, dict) else {}))
        guarded(SECTION, f"particle demo, {mode}", rows, one)
    return rows
