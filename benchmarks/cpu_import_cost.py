"""``import <package>`` of a package of Triton families, 5 against 500, beside ``import numpy``
(issue #36 item 6: a package of 436 families took 6.3 s to import, 6.1 of them compiling every
family's generated call; the bar: 500 families within 50 ms of 5). CPU only, no GPU and no driver
work (the driver initialises at the first launch): each import in a fresh process, the best of
``RUNS``.

The packages are written here: a manifest of ``N`` families (an instance with ``:16`` assumptions
and its ``__base`` twin each, the kernel's signature recorded, as the build writes them) and one PTX
artifact declaring their kernels::

    python benchmarks/cpu_import_cost.py [runs]
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
RUNS = 7
CONTENT = "ab" * 32


def _entries(families: int) -> list[dict[str, object]]:
    from khal_runtime import abi
    from khal_runtime.manifest import Entry, Param, TritonFacts, TritonParam

    u64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
    params = (*(Param(name=n, **u64) for n in ("x", "y", "out")),  # type: ignore[arg-type]
              Param(name="n", kind="scalar", element_type="int32", element_size=4, element_align=4),
              *(Param(name=n, **u64) for n in ("khal_global_scratch", "khal_profile_scratch")))  # type: ignore[arg-type]
    sig = (*(TritonParam(name=n) for n in ("x", "y", "out", "n")),
           TritonParam(name="BLOCK_SIZE", constexpr=True))
    out = []
    for f in range(families):
        for base in (False, True):
            name = f"add_{f}" + ("__base" if base else "")
            facts = TritonFacts(kernel="add_kernel", family=f"add_{f}", base=base, num_warps=4, num_stages=3, shared=0,
                                names=("x", "y", "out", "n"), types=("*fp32", "*fp32", "*fp32", "i32"),
                                divisible=() if base else ("x", "y", "out", "n"), constexprs={"BLOCK_SIZE": 16 * (f + 1)},
                                cache_key="k", triton_version="3.6.0", params=sig, module="bench_kernels.add",
                                qualname="add_kernel")
            h = abi.entry_hash(CONTENT, abi.entry_signature(name, (128, 1, 1), params, grid_dims=3, attributes=None,
                                                            triton=facts.record()))
            e = Entry(name=name, symbol=abi.symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=params,
                      grid_dims=3, triton=facts)
            out.append(e.model_dump(mode="json", exclude_none=True))
    return out


def write_package(root: Path, name: str, families: int) -> Path:
    """``root/<name>/``: ``__init__.py`` loading its kernels, ``_khal/manifest.json``, one PTX."""
    from khal_runtime import abi
    from khal_runtime.manifest import SCHEMA_VERSION

    pkg = root / name
    (pkg / "_khal" / "tri").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n")
    entries = _entries(families)
    lines = [".version 8.0", ".target sm_90", ".address_size 64", ""]
    for e in entries:
        lines.append(f".visible .entry {e['symbol']}(\n\t.param .u64 a0,\n\t.param .u64 a1,\n\t.param .u64 a2,\n"
                     "\t.param .u32 a3,\n\t.param .u64 a4,\n\t.param .u64 a5\n)\n{\n\tret;\n}")
    ptx = ("\n".join(lines) + "\n").encode()
    rel = "_khal/tri/tri.compute_90.ptx"
    (pkg / rel).write_bytes(ptx)
    manifest = {"schema_version": SCHEMA_VERSION, "package": name,
                "toolchain": {"hatch_khal_version": "bench", "abi_version": abi.ABI_VERSION},
                "crates": [{"name": "tri", "language": "triton", "package_dir": "_khal/tri", "sources": [],
                            "content_hash": CONTENT,
                            "artifacts": [{"kind": "ptx", "arch": "compute_90", "path": rel, "ptx_isa": "8.0",
                                           "sha256": hashlib.sha256(ptx).hexdigest(), "size": len(ptx)}],
                            "entries": entries}]}
    data = json.dumps(manifest).encode()
    # as the build writes it: validated through the models, with the digest that lets the runtime
    # read it without building pydantic's validators (khal_runtime.manifest_load)
    from khal_runtime.manifest import parse_manifest
    from khal_runtime.manifest_load import DIGEST_NAME, build_digest

    parse_manifest(data, name)
    (pkg / "_khal" / "manifest.json").write_bytes(data)
    digest = build_digest(data)
    if digest is not None:
        (pkg / "_khal" / DIGEST_NAME).write_text(digest + "\n")
    return pkg


def _import_once(path: Path, module: str) -> float:
    """One fresh process's ``import <module>`` (ms), measured inside it."""
    code = textwrap.dedent(f"""
        import time
        t = time.perf_counter()
        import {module}
        print((time.perf_counter() - t) * 1000)
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(path), env.get("PYTHONPATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("KHAL_BACKEND", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"import {module} failed:\n{r.stderr}")
    return float(r.stdout.strip().splitlines()[-1])


def measure(runs: int = RUNS) -> dict[str, float]:
    """Per row the best of ``runs`` rounds, the rows interleaved in each round (a busy host slows
    them alike)."""
    modules = {"import numpy": "numpy"}
    modules.update({f"import a package of {n} Triton families ({2 * n} entries)": f"tri_families_{n}"
                    for n in (5, 500)})
    rows = {k: float("inf") for k in modules}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in (5, 500):
            write_package(root, f"tri_families_{n}", n)
        for _ in range(runs):
            for k, m in modules.items():
                rows[k] = min(rows[k], _import_once(root, m))
    return rows


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    rows = measure(runs)
    for k, v in rows.items():
        print(f"{k:52s} {v:8.1f} ms")
    a, b = (rows[f"import a package of {n} Triton families ({2 * n} entries)"] for n in (5, 500))
    print(f"{'500 families - 5 families':52s} {b - a:8.1f} ms   (bar: 50 ms)")


if __name__ == "__main__":
    main()
