"""Torch tensors launch on PyTorch's current stream of their device when no ``stream=`` is given
(issue #36 item 4: Triton's launcher does; before, khal launched on its own stream, not ordered after
torch's work), for a kernel's own call and for instance families, on every path (checked, generated,
remembered, bound). On the fake driver with torch-like tensors (a type of module ``torch``) and
PyTorch's current-stream reader replaced: no torch needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from khal_runtime import device

from tests.helpers.fakecuda import FakeDriver, fake, stream  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, variant

P = [param("x"), param("out"), param("n"), param("BLOCK", constexpr=True)]


class TorchTensor(Tensor):
    """What PyTorch's tensor offers the launch: ``data_ptr``, ``dtype``, ``get_device``."""

    def __init__(self, ptr: int, dev: int = 0) -> None:
        super().__init__(ptr)
        self._dev = dev

    def get_device(self) -> int:
        return self._dev


TorchTensor.__module__ = "torch"


@pytest.fixture
def torch_streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """PyTorch's current stream handle of device 0 (settable: ``current[0] = h``)."""
    current = [0x5150]
    monkeypatch.setattr(device, "_torch_raw", lambda dev: current[dev])
    monkeypatch.setattr(device, "TORCH_TENSOR_TYPES", device.TORCH_TENSOR_TYPES)
    yield current
    device.TORCH_TENSOR_TYPES.discard(TorchTensor)


def _stream_handle(launch: dict[str, Any]) -> int:
    s = launch["stream"]  # the fake driver's CUstream(h), or a borrowed stream's native object
    return int(str(s).removeprefix("CUstream(").removesuffix(")")) if str(s).startswith("CUstream(") else s


def test_torch_tensors_launch_on_torchs_current_stream_unless_a_stream_is_given(
        fake: FakeDriver, tmp_path: Path, torch_streams: list[int]) -> None:  # noqa: F811
    es = [variant("k", P, {"x": "*fp32:16", "out": "*fp32:16", "n": "i32:16"}, {"BLOCK": 64},
                  name="fam", family="fam"),
          variant("k", P, {"x": "*fp32", "out": "*fp32", "n": "i32"}, {"BLOCK": 64},
                  name="fam__base", family="fam")]
    ks = load_crate(fake, tmp_path, es)
    x, out = TorchTensor(0x1000), TorchTensor(0x2000)
    own = device.default_stream()
    for launch in (lambda: ks.fam[(4,)](x, out, 4096), lambda: ks.k[(4,)](x, out, 4096, BLOCK=64)):
        torch_streams[0] = 0x5150
        for _ in range(3):  # checked, generated, remembered
            launch()
            assert _stream_handle(fake.launches[-1]) == 0x5150
        torch_streams[0] = 0x6160  # `with torch.cuda.stream(s):` — the next launch follows it
        launch()
        assert _stream_handle(fake.launches[-1]) == 0x6160
    given = stream(0x77, native=0x77)
    ks.fam[(4,)](x, out, 4096, stream=given)
    assert _stream_handle(fake.launches[-1]) == 0x77
    ks.k[(4,)](x, out, 4096, BLOCK=64, stream=given)
    assert _stream_handle(fake.launches[-1]) == 0x77
    b = ks.fam.bind(x, out, 4096)  # bound on torch's stream of the moment
    b(4)
    assert _stream_handle(fake.launches[-1]) == 0x6160
    ks.fam[(4,)](Tensor(0x1000), Tensor(0x2000), 4096)  # not torch: the runtime's own stream
    assert _stream_handle(fake.launches[-1]) == own.handle
