"""Issue #30 on a GPU: the example package's Triton crate (``tutorials``: Triton's tutorials 01-03,
built into the wheel by README command 1) against torch, in a process where ``import triton``
fails; and a stale Triton cubin refused with HashMismatchError on the real driver.

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

NO_TRITON = r"""
import sys
import torch
assert "triton" not in sys.modules, "import torch imported triton"
sys.modules["triton"] = None  # `import triton` raises ImportError from here on
from example_shader_pkg import kernels, tutorials

def check(ok, what):
    if not ok:
        raise SystemExit(f"wrong: {what}")

for dtype, name in ((torch.float32, "add_fp32"), (torch.float16, "add_fp16")):
    for n, offset, want in ((98432, 0, name), (98433, 0, name + "__base"), (98432, 1, name + "__base")):
        x = torch.rand(n + offset, device="cuda", dtype=dtype)[offset:]  # offset 1: not 16-byte aligned
        y = torch.rand(n, device="cuda", dtype=dtype)
        out = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
        k = getattr(kernels, name)
        check(k.chosen(x, y, out, n) == want, f"{name} chose {k.chosen(x, y, out, n)} for n={n} offset={offset}")
        k[lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)](x, y, out, n,
                                                                           stream=tutorials._stream(x))
        torch.cuda.synchronize()
        check(torch.equal(out, x + y), f"{name} n={n} offset={offset}")
        check(torch.equal(tutorials.add(x, y), x + y), f"tutorials.add {name} n={n} offset={offset}")

for rows, cols, want in ((4096, 1024, "softmax_1024"), (1823, 781, "softmax_1024__base"), (4, 1024, "softmax_1024__base"),
                         (5000, 1, "softmax_1024__base")):
    x = torch.randn(rows, cols, device="cuda")
    y = torch.empty_like(x)
    got = kernels.softmax_1024.chosen(y, x, x.stride(0), y.stride(0), rows, cols)
    check(got == want, f"softmax {rows}x{cols} chose {got}")
    check(torch.allclose(tutorials.softmax(x), torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5), f"softmax {rows}x{cols}")

for m, n, k, a_t in ((512, 512, 512, False), (333, 200, 96, False), (256, 256, 256, True)):
    a = torch.randn(k, m, device="cuda", dtype=torch.float16).t() if a_t else \
        torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    got = kernels.matmul_fp16.chosen(a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                     c.stride(0), c.stride(1))
    want = "matmul_fp16" if m % 16 == 0 and n % 16 == 0 and k % 16 == 0 and not a_t else "matmul_fp16__base"
    check(got == want, f"matmul {m}x{n}x{k} a_t={a_t} chose {got}")
    check(torch.allclose(tutorials.matmul(a, b), a @ b, atol=1e-2, rtol=0), f"matmul {m}x{n}x{k} a_t={a_t}")

check(sys.modules["triton"] is None and not any(m.startswith("triton.") for m in sys.modules), "triton imported")
print("ok")
"""


@pytest.fixture(scope="module")
def torch_site(example_site: Path) -> Path:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    pytest.importorskip("torch")
    return example_site


def _env(site: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_the_example_triton_kernels_match_torch_with_triton_unimportable(torch_site: Path) -> None:
    r = subprocess.run([sys.executable, "-c", NO_TRITON], capture_output=True, text=True, env=_env(torch_site),
                       timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_a_stale_triton_cubin_is_refused_with_a_hash_mismatch(torch_site: Path, tmp_path: Path) -> None:
    """The crate's binaries as another build of softmax left them (its symbol names another hash),
    under the current manifest: the driver loads the cubin, the entry's symbol is not in it."""
    import khal_runtime
    from khal_runtime.errors import HashMismatchError

    site = tmp_path / "site"
    shutil.copytree(torch_site / "example_shader_pkg", site / "example_shader_pkg")
    path = site / "example_shader_pkg" / "_khal" / "manifest.json"
    m = json.loads(path.read_text())
    crate = next(c for c in m["crates"] if c["name"] == "tutorials")
    soft = next(e for e in crate["entries"] if e["name"] == "softmax_1024")
    for art in crate["artifacts"]:
        p = site / "example_shader_pkg" / art["path"]
        data = p.read_bytes().replace(soft["hash"].encode(), b"0123456789abcdef")
        assert data != p.read_bytes() or art["kind"] not in ("cubin", "ptx")
        p.write_bytes(data)
        art["sha256"], art["size"] = hashlib.sha256(data).hexdigest(), len(data)
    path.write_text(json.dumps(m))
    ks = khal_runtime.load(site / "example_shader_pkg")
    import torch

    x = torch.randn(4, 100, device="cuda")
    y = torch.empty_like(x)
    with pytest.raises(HashMismatchError, match="softmax_1024"):
        ks.softmax_1024[(4,)](y, x, 100, 100, 4, 100)
