"""Issues #30 / #36 on a GPU: the example package's Triton crate (``tutorials``: Triton's tutorials
01-03, the variants of example_shader_pkg/khal-triton.lock, built into the wheel by README command 1)
against torch, through the package's Triton host code (``example_shader_pkg.tutorials``:
``add_kernel[grid](..., BLOCK_SIZE=1024)``) and the kernel's own call (``kernels.add_kernel``), in a
process where Triton is not installed (``KHAL_TEST_HIDE=triton``); and a stale Triton cubin refused
with HashMismatchError on the real driver.

``KHAL_TRITON_STATS=1`` counts each launch: the aligned shapes run the variant with exactly the JIT's
specialisation, the others the kernel's conservative variant, none the JIT. The CPU twin of the
shapes (which variant each takes, on the fake driver): tests/runtime/test_example_triton.py.

Needs torch (the kernels take torch tensors); the H200 has it. Outputs start as NaN."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]
HIDE = ROOT / "tests" / "helpers" / "hide"

NO_TRITON = r"""
import importlib.util
import sys
import torch
assert importlib.util.find_spec("triton") is None, "KHAL_TEST_HIDE=triton did not hide Triton"
from example_shader_pkg import kernels, tutorials
from khal_runtime import triton_call

def check(ok, what):
    if not ok:
        raise SystemExit(f"wrong: {what}")

check(tutorials.add_kernel is kernels.add_kernel, "tutorials' add_kernel is not the wheel's kernel")
for dtype in (torch.float32, torch.float16):
    for n, offset in ((98432, 0), (98433, 0), (98432, 1)):
        x = torch.rand(n + offset, device="cuda", dtype=dtype)[offset:]  # offset 1: not 16-byte aligned
        y = torch.rand(n, device="cuda", dtype=dtype)
        check(torch.equal(tutorials.add(x, y), x + y), f"tutorials.add {dtype} n={n} offset={offset}")
        out = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
        kernels.add_kernel[lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)](
            x, y, out, n_elements=n, BLOCK_SIZE=1024)  # Triton's call, on torch's current stream
        torch.cuda.synchronize()
        check(torch.equal(out, x + y), f"kernels.add_kernel {dtype} n={n} offset={offset}")

for rows, cols in ((4096, 1024), (1823, 781), (4, 1024), (5000, 1)):
    x = torch.randn(rows, cols, device="cuda")
    check(torch.allclose(tutorials.softmax(x), torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5), f"softmax {rows}x{cols}")

for m, n, k, a_t in ((512, 512, 512, False), (333, 200, 96, False), (256, 256, 256, True)):
    a = torch.randn(k, m, device="cuda", dtype=torch.float16).t() if a_t else \
        torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    check(torch.allclose(tutorials.matmul(a, b), a @ b, atol=1e-2, rtol=0), f"matmul {m}x{n}x{k} a_t={a_t}")

# the aligned shapes: exactly the JIT's variant; the ragged, unaligned and transposed ones: the
# conservative variant; nothing through the JIT
want = {"tutorials.add_kernel": {"exact": 4, "other": 8, "jit": 0},
        "tutorials.matmul_kernel": {"exact": 1, "other": 2, "jit": 0},
        "tutorials.softmax_kernel": {"exact": 1, "other": 3, "jit": 0}}
check(triton_call.stats() == want, f"launches counted {triton_call.stats()}, not {want}")
check(importlib.util.find_spec("triton") is None and not any(m == "triton" or m.startswith("triton.")
                                                             for m in sys.modules), "triton imported")
print("ok")
"""


@pytest.fixture(scope="module")
def torch_site(example_site: Path) -> Path:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    pytest.importorskip("torch")
    return example_site


def _env(site: Path) -> dict[str, str]:
    return dict(os.environ, KHAL_TEST_HIDE="triton", KHAL_TRITON_STATS="1",
                PYTHONPATH=os.pathsep.join([str(HIDE), str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_the_example_triton_kernels_match_torch_without_triton_installed(torch_site: Path) -> None:
    r = subprocess.run([sys.executable, "-c", NO_TRITON], capture_output=True, text=True, env=_env(torch_site),
                       timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_a_stale_triton_cubin_is_refused_with_a_hash_mismatch(torch_site: Path, tmp_path: Path) -> None:
    """The crate's binaries as another build of softmax left them (its variants' symbols name another
    hash), under the current manifest: the driver loads the cubin, the entry's symbol is not in it."""
    import khal_runtime
    from khal_runtime.errors import HashMismatchError

    site = tmp_path / "site"
    shutil.copytree(torch_site / "example_shader_pkg", site / "example_shader_pkg")
    path = site / "example_shader_pkg" / "_khal" / "manifest.json"
    m = json.loads(path.read_text())
    crate = next(c for c in m["crates"] if c["name"] == "tutorials")
    soft = [e for e in crate["entries"] if e["triton"]["kernel"] == "softmax_kernel"]
    assert len(soft) == 2  # the aligned variant and the conservative one
    for art in crate["artifacts"]:
        p = site / "example_shader_pkg" / art["path"]
        data = p.read_bytes()
        for e in soft:
            data = data.replace(e["hash"].encode(), b"0123456789abcdef")
        assert data != p.read_bytes() or art["kind"] not in ("cubin", "ptx")
        p.write_bytes(data)
        art["sha256"], art["size"] = hashlib.sha256(data).hexdigest(), len(data)
    path.write_text(json.dumps(m))
    ks = khal_runtime.load(site / "example_shader_pkg")
    import torch

    x = torch.randn(4, 100, device="cuda")
    y = torch.empty_like(x)
    with pytest.raises(HashMismatchError, match="softmax_kernel__v"):
        ks.softmax_kernel[(4,)](y, x, 100, 100, 4, 100, BLOCK_SIZE=1024, num_warps=8)
