"""The example's Triton story on the CPU (issue #36): the example wheel (README command 1) serves the
kernels of ``example_shader_pkg/triton_kernels/tutorials.py``, and ``example_shader_pkg.tutorials``
(Triton host code, ``add_kernel[grid](x, y, out, n, BLOCK_SIZE=1024)``) runs unchanged on the fake
driver:

* in a process where Triton is not installed (``KHAL_TEST_HIDE=triton``: the kernels' module imports
  khal's stand-in, and no ``triton`` is left after), and in one where it is installed with
  ``triton.compile`` patched to raise;
* every shape the GPU test (tests/runtime/cuda/test_example_triton_gpu.py) launches is covered by a
  variant of ``khal-triton.lock``: the aligned shapes by the variant with exactly the JIT's
  specialisation, the others by the kernel's conservative variant;
* a call the lock does not cover raises ``TritonMissingVariantError`` naming the lock table to add.

torch is the stand-in of tests/helpers/faketorch (tensors at fake-driver addresses): khal launches CUDA
tensors only, and there is no GPU here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from khal_runtime.manifest import Manifest, load_manifest
from tests.helpers.paths import ROOT
from tests.helpers.triton_serving import HIDE, run_fake

FAKE_TORCH = ROOT / "tests" / "helpers" / "faketorch"

#: the calls of the GPU test, and the variant each must launch: "fast" (every assumption the lock's
#: aligned variant makes holds: exactly the JIT's specialisation) or "conservative"
SCRIPT = '''
import importlib.util, json
import torch
from example_shader_pkg import kernels, tutorials
from khal_runtime.errors import TritonMissingVariantError

sym = {e.symbol: e.name for c in kernels.manifest.crates for e in c.entries}
got = []


def took(label):
    got.append([label, sym[str(drv.launches[-1]["f"]).removeprefix("FUNC:")]])


for dt in (torch.float32, torch.float16):
    for n, offset in ((98432, 0), (98433, 0), (98432, 1)):
        x, y = torch.tensor((n,), dt, offset=offset), torch.tensor((n,), dt)  # offset 1: not 16-byte aligned
        tutorials.add(x, y)
        took(f"add {dt} {n} {offset}")
        out = torch.empty_like(y)
        kernels.add_kernel[lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)](
            x, y, out, n_elements=n, BLOCK_SIZE=1024)
        took(f"kernels.add_kernel {dt} {n} {offset}")
for rows, cols in ((4096, 1024), (1823, 781), (4, 1024), (5000, 1)):
    tutorials.softmax(torch.tensor((rows, cols)))
    took(f"softmax {rows}x{cols}")
for m, n, k, a_t in ((512, 512, 512, False), (333, 200, 96, False), (256, 256, 256, True)):
    a = torch.tensor((m, k), torch.float16, strides=(1, m) if a_t else None)  # a_t: randn(k, m).t()
    tutorials.matmul(a, torch.tensor((k, n), torch.float16))
    took(f"matmul {m}x{n}x{k} {a_t}")
try:
    tutorials.add(torch.tensor((4096,), torch.bfloat16), torch.tensor((4096,), torch.bfloat16))
    missing = None
except TritonMissingVariantError as exc:
    missing = str(exc)
print(json.dumps({
    "got": got,
    "served": tutorials.add_kernel is kernels.add_kernel and tutorials.softmax_kernel is kernels.softmax_kernel,
    "host": type(kernels.add_kernel.host).__module__ + "." + type(kernels.add_kernel.host).__name__,
    "find_spec": repr(importlib.util.find_spec("triton")),
    "missing": missing,
}))
'''

UNREACHABLE = '''
import triton, triton.compiler
def unreachable(*a, **k):
    raise AssertionError("triton.compile was called")
triton.compile = unreachable
triton.compiler.compile = unreachable
'''


def _want() -> list[tuple[str, str]]:
    out = []
    for dt in ("torch.float32", "torch.float16"):
        for n, offset in ((98432, 0), (98433, 0), (98432, 1)):
            kind = "fast" if (n, offset) == (98432, 0) else "conservative"
            out += [(f"add {dt} {n} {offset}", kind), (f"kernels.add_kernel {dt} {n} {offset}", kind)]
    out += [("softmax 4096x1024", "fast"), ("softmax 1823x781", "conservative"), ("softmax 4x1024", "conservative"),
            ("softmax 5000x1", "conservative")]
    out += [("matmul 512x512x512 False", "fast"), ("matmul 333x200x96 False", "conservative"),
            ("matmul 256x256x256 True", "conservative")]
    return out


def _kinds(manifest: Manifest) -> dict[str, str]:
    """Each tutorials entry: "fast" (its pointers all assumed aligned) or "conservative"."""
    out = {}
    for e in manifest.crate("tutorials").entries:
        t = e.triton
        assert t is not None
        pointers = [n for n, ty in zip(t.names, t.types) if ty.startswith("*")]
        out[e.name] = "fast" if set(pointers) <= set(t.divisible) else "conservative"
    return out


def _run(site: Path, *, hide_triton: bool, prelude: str = "") -> dict[str, Any]:
    paths = [str(HIDE)] if hide_triton else []
    env = {"PYTHONPATH": os.pathsep.join([*paths, str(FAKE_TORCH), str(ROOT), str(site)])}
    proc = run_fake(site, prelude + SCRIPT, hide_triton=hide_triton, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _check(out: dict[str, Any], site: Path) -> None:
    kinds = _kinds(load_manifest(site / "example_shader_pkg" / "_khal" / "manifest.json"))
    assert [(label, kinds[name]) for label, name in out["got"]] == _want()
    assert out["served"] is True
    missing = out["missing"]
    assert missing is not None and "tutorials.add_kernel: no built variant covers the call" in missing
    assert ('  [[variant]]\n  crate = "tutorials"\n  kernel = "add_kernel"\n  args = { x_ptr = "*bf16:16", '
            'y_ptr = "*bf16:16", output_ptr = "*bf16:16", n_elements = "i32:16" }\n  constexprs = { BLOCK_SIZE = 1024 }\n'
            '  num_warps = 4\n  num_stages = 3') in missing
    assert "python -m hatch_khal triton record -- <your command>" in missing


def test_the_example_host_code_runs_without_triton_installed(example_site: Path) -> None:
    out = _run(example_site, hide_triton=True)
    _check(out, example_site)
    assert out["host"] == "khal_runtime.triton_standin.runtime.JITFunction"
    assert out["find_spec"] == "None"  # the stand-in is gone once the kernels' module has run


def test_the_example_host_code_runs_with_triton_installed_and_its_compiler_unreachable(example_site: Path) -> None:
    pytest.importorskip("triton", reason="Triton is not installed")
    out = _run(example_site, hide_triton=False, prelude=UNREACHABLE)
    _check(out, example_site)
    assert out["host"] == "triton.runtime.jit.JITFunction"
