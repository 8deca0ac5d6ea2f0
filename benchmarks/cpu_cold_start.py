"""Cold start on a CPU (#38 item 18): ``import <package>`` against ``import numpy``, in fresh
processes, no GPU and no driver touched (an import does no GPU work; the driver's initialisation
is lazy, and ``KHAL_EAGER_INIT=0`` makes sure of it).

Rows, medians (and minimums) of fresh processes run in turns, bytecode caching on (as an
installed wheel: ``PYTHONDONTWRITEBYTECODE`` dropped, one untimed run first):

* ``import numpy`` alone (the floor the bar is measured from: the package imports numpy itself);
* ``import <package>`` (what a user's ``import example_shader_pkg`` costs): the manifest read
  through its digest, no pydantic (:mod:`khal_runtime.manifest_load`);
* the same with the digest removed from a copy of the package: the manifest validated by the
  pydantic models, what every import cost before;
* ``import khal_runtime`` + ``load()`` of the package by name (no numpy), with and without the digest;
* pydantic's ``BaseModel`` imported alone.

The bar (DESIGN.md, performance bars): ``import <package>`` within 30 ms of ``import numpy``.
The package is the example (``--site DIR``: a directory holding an unpacked example wheel, else
wherever ``example_shader_pkg`` imports from, built); without it, a synthetic package of three
CUDA C++ entries (NVRTC needed to build it)::

    PYTHONPATH=. python benchmarks/cpu_cold_start.py [--site DIR] [--reps 15]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
what, name = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if what == "numpy":
    import numpy
elif what == "package":
    __import__(name)
elif what == "load":
    import khal_runtime
    khal_runtime.load(name)
elif what == "pydantic":
    from pydantic import BaseModel
t1 = time.perf_counter()
print(json.dumps({"ms": (t1 - t0) * 1e3, "pydantic": "pydantic" in sys.modules}))
"""


def _env(paths: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: pip compiles the bytecode at install
    env["KHAL_EAGER_INIT"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                               if p]])
    return env


def _child(env: dict[str, str], what: str, name: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", CHILD, what, name], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    if r.returncode:
        raise RuntimeError((r.stderr or r.stdout).strip().splitlines()[-1])
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _package(site: str | None, tmp: Path) -> tuple[str, Path]:
    """(import name, the directory on sys.path holding it)."""
    if site:
        return "example_shader_pkg", Path(site)
    spec = importlib.util.find_spec("example_shader_pkg")
    if spec is not None and spec.origin and (Path(spec.origin).parent / "_khal" / "manifest.json").exists():
        return "example_shader_pkg", Path(spec.origin).parent.parent
    sys.path.insert(0, str(ROOT))
    from tests.helpers.synthetic import build_package  # lazy: a synthetic package needs NVRTC

    build_package(tmp, "khal_cold_synth_pkg")
    return "khal_cold_synth_pkg", tmp


def measure(site: str | None = None, reps: int = 15) -> dict[str, dict[str, float]]:
    tmp = Path(tempfile.mkdtemp(prefix="khal-cold-"))
    try:
        name, where = _package(site, tmp)
        # a copy without the digest: validated by the models at every import, as before #38
        plain = tmp / "no-digest"
        shutil.copytree(where / name, plain / name)
        (plain / name / "_khal" / "manifest.digest").unlink(missing_ok=True)
        envs = {"digest": _env([str(where)]), "no digest": _env([str(plain)])}
        cases = [("import numpy", envs["digest"], "numpy"),
                 (f"import {name}", envs["digest"], "package"),
                 (f"import {name}, no digest (validated)", envs["no digest"], "package"),
                 ("import khal_runtime + load() (no numpy)", envs["digest"], "load"),
                 ("import khal_runtime + load(), no digest", envs["no digest"], "load"),
                 ("from pydantic import BaseModel", envs["digest"], "pydantic")]
        for _, env, what in cases:  # untimed: bytecode written, files in the page cache
            _child(env, what, name)
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in cases}
        for _ in range(reps):  # in turns: drift weighs on every row alike
            for label, env, what in cases:
                runs[label].append(_child(env, what, name))
        out = {}
        for label, rs in runs.items():
            ms = [r["ms"] for r in rs]
            out[label] = {"median": statistics.median(ms), "min": min(ms), "pydantic": any(r["pydantic"] for r in rs)}
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", help="a directory holding example_shader_pkg (an unpacked wheel)")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    got = measure(args.site, args.reps)
    base = next(v for k, v in got.items() if k == "import numpy")
    print(f"cold start, fresh processes, median (min) of {args.reps} in turns, ms:")
    for label, v in got.items():
        extra = f"  (+{v['median'] - base['median']:.1f} over numpy)" if label.startswith("import ") and \
            label != "import numpy" and "khal_runtime" not in label else ""
        pyd = "  [pydantic imported]" if v["pydantic"] and "pydantic" not in label else ""
        print(f"  {label:48s} {v['median']:7.1f} ({v['min']:.1f}){extra}{pyd}")
    pkg = next(k for k in got if k.startswith("import ") and k != "import numpy" and "no digest" not in k
               and "khal_runtime" not in k)
    beyond = got[pkg]["median"] - base["median"]
    print(f"bar: {pkg} within 30 ms of import numpy: +{beyond:.1f} ms -> {'met' if beyond <= 30 else 'MISSED'}")


if __name__ == "__main__":
    main()
