"""Kernel.bind: arguments checked and packed once, then launches at raw cost (CPU, fake driver)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from khal_runtime import DeviceBuffer
from khal_runtime.device import _tls
from khal_runtime.errors import ArgumentError
from tests.helpers.runtime import P, Tensor, _kernel
from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401  (fixture)


def test_bind_packs_once_and_launches_with_the_thread_count(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    uploads: list[bytes] = []
    monkeypatch.setattr(DeviceBuffer, "from_numpy",
                        classmethod(lambda cls, a, stream=None: (uploads.append(bytes(a)),
                                                                 DeviceBuffer(0xE000, a.size, np.uint8, 0))[1]))
    x, y, z = (DeviceBuffer(0x1000 * (i + 1), 300 + i, "float32", 0) for i in range(3))
    p = P(2.0, 3.0)
    b = k.bind(x, y, z, p, 0.25, stream=st)
    assert uploads == [bytes(p)]  # the host struct copied once, to memory the bound launch owns
    p.a = 9.0  # bound: later changes are not seen
    for n in (300, 129, 1):
        b(n)
    b(0)  # nothing to do
    assert [l["grid"] for l in fake.launches] == [(3, 1, 1), (2, 1, 1), (1, 1, 1)]
    slots = fake.launches[0]["slots"]
    assert all(l["slots"] == slots for l in fake.launches)
    u64 = [struct.unpack("<Q", slots[i])[0] for i in range(7)]
    assert u64 == [0x1000, 300, 0x2000, 301, 0x3000, 302, 0xE000]
    assert struct.unpack("<f", slots[7])[0] == 0.25
    with pytest.raises(ValueError, match=">= 0"):
        b(-1)


def test_a_bound_launch_makes_its_configuration_once_per_grid(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread count equal to the last one, but another object (an int that went through torch's
    dispatcher, or was computed), or another count with the same grid, launches with the launch
    configuration already made: making one costs microseconds on the GPU machine, and the torch
    operators' bound launches were making one on every call."""
    made: list[object] = []

    class Config(fake.CUlaunchConfig):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            made.append(self)

    monkeypatch.setattr(fake, "CUlaunchConfig", Config)
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x, y, z = (DeviceBuffer(0x1000 * (i + 1), 1000, "float32", 0) for i in range(3))
    b = k.bind(x, y, z, DeviceBuffer(0xE000, 8, "uint8", 0), 0.25, stream=st)
    bx = k.block_size[0]
    for _ in range(5):
        b(int(str(3 * bx)))  # equal, never the same object
    b(3 * bx - 1)  # another count, the same grid
    assert len(made) == 1 and [la["grid"] for la in fake.launches] == [(3, 1, 1)] * 6
    b(4 * bx)  # another grid: its own configuration
    b(3 * bx)
    assert len(made) == 3 and [la["grid"] for la in fake.launches[-2:]] == [(4, 1, 1), (3, 1, 1)]


def test_bind_checks_arguments_like_a_launch(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 10, "float32", 0)
    i32 = DeviceBuffer(0x1000, 10, "int32", 0)
    with pytest.raises(ArgumentError, match=r"five\(\): argument 'y'.*element type float32"):
        k.bind(x, i32, x, P(1, 2), 1.0, stream=st)
    with pytest.raises(ArgumentError, match=r"takes 5 argument"):
        k.bind(x, x, x, P(1, 2), stream=st)
    assert fake.launches == []


def test_bind_of_a_torch_like_array_snapshots_its_pointer(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 10, "float32", 0)
    t = Tensor(0x9000, 10)
    dev_uniform = DeviceBuffer(0x7000, 8, np.uint8, 0)  # a struct already on the device
    b = k.bind(t, x, x, dev_uniform, 1.0, stream=st)
    b(10)
    slots: Any = fake.launches[-1]["slots"]
    assert struct.unpack("<Q", slots[0])[0] == 0x9000 and struct.unpack("<Q", slots[6])[0] == 0x7000


def test_bind_holds_a_tensors_storage(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """``t.data = other`` after binding frees t's old memory in torch; the bound launch still
    launches on it (the rule of graphs), so it holds that memory's storage: no use after free."""
    import gc
    import weakref

    from tests.helpers.runtime import VersionedTensor

    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 10, "float32", 0)
    t = VersionedTensor(0x9000, 10)
    old = weakref.ref(t.storage)
    b = k.bind(t, x, x, DeviceBuffer(0x7000, 8, np.uint8, 0), 1.0, stream=st)
    t.set_data(0xA000, 10)
    gc.collect()
    assert old() is not None
    b(10)
    assert struct.unpack("<Q", fake.launches[-1]["slots"][0])[0] == 0x9000
    del b
    gc.collect()
    assert old() is None


def test_a_buffer_freed_after_bind_is_refused_not_launched(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    from khal_runtime.errors import ArgumentValueError

    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x, y = DeviceBuffer(0x1000, 300, "float32", 0), DeviceBuffer(0x2000, 300, "float32", 0)
    b = k.bind(x, y, y, DeviceBuffer(0x7000, 8, np.uint8, 0), 1.0, stream=st)
    b(300)
    DeviceBuffer(0x5000, 4, "float32", 0).free()  # an unrelated free: checked again, still fine
    b(300)
    x.free()
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*freed"):
        b(300)
    assert len(fake.launches) == 2
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(b)
