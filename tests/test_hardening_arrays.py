"""Issue #29 (runtime items 5-7) and #25: arrays that lie, arrays that are read-only, arrays at a
misaligned address, and the torch / CuPy inline reads of the CUDA launch path.

Every refusal is a named error (ArgumentError / ArgumentValueError) naming the entry and the
parameter, raised before anything is launched, on every path that reads a pointer: the typed
call (its generic path and its generated code), ``launch()``, ``bind()``, ``check_args`` and the
indirect count buffer."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pytest

from khal_runtime.arguments import Short
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import ArgumentError, ArgumentValueError, KhalError
from tests._runtime import Tensor
from tests.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar, storage, uniform  # noqa: F401


class Params(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


@pytest.fixture
def ks(fake: FakeDriver, tmp_path: Any) -> Any:
    return fake_kernels(fake, tmp_path, [
        make_entry("axpby", (storage("x"), storage("y", writable=True), uniform("p"), scalar("bias")), block=256),
    ])


def _buf(ptr: int = 0x100000, n: int = 1024) -> DeviceBuffer:
    return DeviceBuffer(ptr, n, "float32", 0)


def _context_chain(exc: BaseException) -> list[type[BaseException]]:
    out: list[type[BaseException]] = []
    e: BaseException | None = exc
    while e is not None:
        out.append(type(e))
        e = e.__context__
    return out


# -- issue #25: the inline reads raise Short, the name the generated namespace defines ----------
def _cupy_type() -> type:
    class ndarray:  # noqa: N801  (what the probe sees as cupy.ndarray)
        def __init__(self, ptr: int, n: int, contiguous: bool = True) -> None:
            import numpy as np

            self.data = SimpleNamespace(ptr=ptr)
            self.size = n
            self.dtype = np.dtype(np.float32)
            self._c_contiguous = contiguous
            self.device = SimpleNamespace(id=0)

    ndarray.__module__ = "cupy"
    return ndarray


def test_the_torch_inline_read_raises_short_not_a_name_error(ks: Any, fake: FakeDriver) -> None:
    y = _buf()
    ks.axpby(4, Tensor(0x9000, 16), y, Params(1, 2), 0.5)  # first sight: the torch read is inlined
    ks.axpby(4, Tensor(0x9000, 16), y, Params(1, 2), 0.5)  # through the inlined lines
    with pytest.raises(ArgumentValueError, match=r"axpby\(\): argument 'x'.*non-contiguous") as ei:
        ks.axpby(4, Tensor(0x9000, 16, contiguous=False), y, Params(1, 2), 0.5)
    chain = _context_chain(ei.value)
    assert NameError not in chain and Short in chain, chain
    assert len(fake.launches) == 2


def test_the_cupy_inline_read_raises_short_not_a_name_error(ks: Any, fake: FakeDriver) -> None:
    C = _cupy_type()
    y = _buf()
    ks.axpby(4, C(0x9000, 16), y, Params(1, 2), 0.5)
    ks.axpby(4, C(0x9000, 16), y, Params(1, 2), 0.5)
    with pytest.raises(ArgumentValueError, match=r"axpby\(\): argument 'x'.*non-contiguous CuPy") as ei:
        ks.axpby(4, C(0x9000, 16, contiguous=False), y, Params(1, 2), 0.5)
    chain = _context_chain(ei.value)
    assert NameError not in chain and Short in chain, chain
    assert len(fake.launches) == 2
