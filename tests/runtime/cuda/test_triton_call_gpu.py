"""Issue #36 on a GPU: the example package's Triton kernel through its own call
(``kernels.add_kernel[grid](x, y, out, n, BLOCK_SIZE=1024)``), with torch tensors and no ``stream=``:
it runs on PyTorch's current stream (ordered after the torch work queued there before it) and
matches torch; the variant it launches for aligned tensors is the one the JIT would compile.

Needs torch and a build that records the kernel's signature (``TritonFacts.params``): skipped where
the example wheel was built without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels(example_site: Path) -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    pytest.importorskip("torch")
    import khal_runtime
    from khal_runtime.triton_call import TritonFunction

    ks = khal_runtime.load(example_site / "example_shader_pkg")
    if not isinstance(getattr(ks, "add_kernel", None), TritonFunction):
        pytest.skip("the example wheel records no Triton kernel signature (TritonFacts.params)")
    return ks


def test_the_kernels_own_call_runs_on_torchs_current_stream_and_matches_torch(
        kernels: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from khal_runtime import triton_call

    monkeypatch.setattr(triton_call, "_stats", {})
    monkeypatch.setattr(triton_call, "_STATS_ON", True)
    side = torch.cuda.Stream()
    for n in (98432, 98433):
        x = torch.rand(n, device="cuda")
        big = torch.rand(1 << 26, device="cuda")
        y = torch.rand(n, device="cuda")
        out = torch.full((n,), float("nan"), device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            for _ in range(4):
                big.mul_(1.0001)  # keep the side stream busy: a launch elsewhere would run before y is doubled
            y.mul_(2)
            kernels.add_kernel[lambda meta: (triton_cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n, BLOCK_SIZE=1024)
        side.synchronize()
        assert torch.equal(out, x + y), n
    got = triton_call.stats()
    key = next(k for k in got if k.endswith(".add_kernel"))
    assert got[key]["exact"] >= 1  # the aligned call (n = 98432) ran the JIT's variant


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
