"""Issue #38's run-time items on a GPU, with the example package (built by the hook: its manifest
read through the build's digest, no pydantic) and torch: inference tensors remembered and
followed through in-place changes, a dtype changed at the same address refused, empty launches.
The CPU tests (tests/runtime/test_hardening_rt.py, test_torch_memo.py) check the same with the
fake driver.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch() -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} has no CUDA")
    return torch


def test_the_example_package_was_loaded_without_pydantic_validation(example_pkg: Any) -> None:
    from khal_runtime import manifest_records

    assert type(example_pkg.kernels.manifest) is manifest_records.Manifest
    assert (example_pkg.kernels.package_dir / "_khal" / "manifest.digest").is_file()


def test_inference_tensors_are_remembered_and_follow_in_place_changes(torch: Any, example_pkg: Any) -> None:
    ks, n = example_pkg.kernels, 1 << 16
    p = example_pkg.SaxpyParams(a=2.0)
    st = torch.cuda.current_stream()
    with torch.inference_mode():
        x, y = torch.rand(n, device="cuda"), torch.zeros(n, device="cuda")
        want = torch.zeros(n, device="cuda")
        for _ in range(12):  # past the memo's promotion to a shared snapshot
            ks.saxpy(example_pkg.elementwise_threads(n), x, y, p, stream=st)
            want += 2 * x
        torch.cuda.synchronize()
        assert torch.allclose(y, want)
        y.resize_(n // 2)  # in place, no version counter: the count packed is read again
        before = y.clone()
        ks.saxpy(example_pkg.elementwise_threads(n // 2), x, y, p, stream=st)
        torch.cuda.synchronize()
        assert torch.allclose(y, before + 2 * x[: n // 2])
    y.data = y.data.view(torch.int32)  # the same address and no version: the dtype is compared
    with pytest.raises(TypeError, match=r"argument 'y'.*int32"):
        ks.saxpy(example_pkg.elementwise_threads(n // 2), x, y, p, stream=st)


def test_an_empty_launch_launches_nothing_on_the_gpu(torch: Any, example_pkg: Any) -> None:
    ks = example_pkg.kernels
    x, y = torch.rand(1024, device="cuda"), torch.zeros(1024, device="cuda")
    p = example_pkg.SaxpyParams(a=2.0)
    st = torch.cuda.current_stream()
    ks.saxpy.launch(0, None, x, y, p, stream=st)
    ks.saxpy(0, x, y, p, stream=st)
    add = ks.add_fp32
    out = torch.full((1024,), float("nan"), device="cuda")
    for grid in (0, (0,), lambda meta: ((0 + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)):
        add[grid](x, y, out, 0, stream=st)
    add.bind(x, y, out, 1024, stream=st)(0)
    torch.cuda.synchronize()
    assert torch.count_nonzero(y) == 0 and torch.isnan(out).all()
