"""The typed call's memo for torch tensors (``interop.VERSIONED_ARRAY_TYPES``), on CPU with a
fake driver: a repeated launch with the same tensors reuses what it packed, unless a tensor's
``_version`` or ``data_ptr()`` moved; the memo keeps each tensor's storage. With torch
installed, the same against real tensors (CPU tensors that report ``is_cuda``)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from khal_runtime import DeviceBuffer, interop
from khal_runtime.backends.cuda.launchgen import PROMOTE_AFTER, SLOTS
from khal_runtime.device import _tls
from khal_runtime.errors import ArgumentValueError
from tests.helpers.runtime import P, _kernel, _u64
from tests.helpers.runtime import VersionedTensor as Tensor
from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401  (fixture)


class InferenceTensor(Tensor):
    """A tensor made under ``torch.inference_mode()``: reading ``_version`` raises, and in
    torch that costs tens of microseconds (a C++ error with its backtrace): never read it."""

    version_reads = 0
    contiguous = True

    def is_inference(self) -> bool:
        return True

    def is_contiguous(self) -> bool:
        return self.contiguous

    @property  # type: ignore[override]
    def _version(self) -> int:
        InferenceTensor.version_reads += 1
        raise RuntimeError("Inference tensors do not track version counter.")

    @_version.setter
    def _version(self, v: int) -> None:
        pass


InferenceTensor.__module__ = "torch"


class SwappableTensor(Tensor):
    """A tensor ``torch.utils.swap_tensors`` can turn into an inference tensor in place: from
    then on reading its ``_version`` raises."""

    version_reads = 0

    def __init__(self, ptr: int, n: int) -> None:
        self.inference = False
        super().__init__(ptr, n)

    def is_inference(self) -> bool:
        return self.inference

    @property  # type: ignore[override]
    def _version(self) -> int:
        SwappableTensor.version_reads += 1
        if self.inference:
            raise RuntimeError("Inference tensors do not track version counter.")
        return self._v

    @_version.setter
    def _version(self, v: int) -> None:
        self._v = v


SwappableTensor.__module__ = "torch"


class CountingTensor(Tensor):
    """Counts ``untyped_storage()`` calls: what storing a memo slot reads of a tensor (with its
    version), and what a full read that stores nothing never reads."""

    storage_reads = 0

    def untyped_storage(self) -> Any:
        CountingTensor.storage_reads += 1
        return super().untyped_storage()


CountingTensor.__module__ = "torch"


@pytest.fixture
def call(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> Any:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    p = P(1.0, 2.0)

    def launch(x: Any, y: Any, z: Any) -> tuple[tuple[int, int], ...]:
        k(300, x, y, z, p, 0.5, stream=st)
        last = fake.launches[-1]
        return tuple((_u64(last, 2 * i), _u64(last, 2 * i + 1)) for i in range(3))

    launch.kernel = k  # type: ignore[attr-defined]
    return launch


def test_torch_type_is_versioned_and_memoable() -> None:
    t = Tensor(0x1000, 10)
    interop.extractor_for(t)
    assert Tensor in interop.VERSIONED_ARRAY_TYPES and Tensor in interop.MEMO_ARRAY_TYPES
    assert Tensor not in interop.STABLE_ARRAY_TYPES
    assert interop.tensor_memo(t) == (0, t.storage)
    assert interop.tensor_memo(DeviceBuffer(0x1000, 1, "float32", 0)) is None
    interop.extractor_for(InferenceTensor(0x1000, 10))
    inf = InferenceTensor(0x1000, 10)
    assert interop.tensor_memo(inf) == (interop.UNVERSIONED, inf.storage)  # no version: compared by its facts


@pytest.mark.parametrize("repeats", [2, PROMOTE_AFTER + 3], ids=["memo slot", "shared snapshot"])
def test_repeated_tensors_are_packed_once_and_repacked_when_they_change(call: Any, fake: FakeDriver,
                                                                      repeats: int) -> None:
    x, y, z = Tensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    for _ in range(repeats):
        call(x, y, z)
    before, ex = Tensor.reads, fake.ex_calls
    assert call(x, y, z) == ((0x1000, 300), (0x2000, 300), (0x3000, 300))
    assert Tensor.reads == before  # reused: no tensor read again
    if repeats > PROMOTE_AFTER:
        assert fake.ex_calls == ex + 1  # from the shared snapshot

    y.resize_(200)  # in place, same pointer: the version moves
    assert call(x, y, z) == ((0x1000, 300), (0x2000, 200), (0x3000, 300))
    assert Tensor.reads > before

    z.set_data(0x9000, 300)  # ``z.data = other``: same version, another pointer
    assert call(x, y, z) == ((0x1000, 300), (0x2000, 200), (0x9000, 300))
    for _ in range(repeats):  # and the new state is remembered in turn
        call(x, y, z)
    before = Tensor.reads
    assert call(x, y, z) == ((0x1000, 300), (0x2000, 200), (0x9000, 300))
    assert Tensor.reads == before


def test_a_set_seen_once_stores_no_memo_slot(call: Any) -> None:
    """A new tensor every call (a compiled graph's intermediate) can never hit the memo: its
    full read stores no slot (no version or storage read for it) and evicts none; the second
    full read of the same objects stores one, which the third call hits."""
    y, z = CountingTensor(0x2000, 300), CountingTensor(0x3000, 300)
    kept = CountingTensor(0x4000, 300)
    call(kept, y, z)  # first sight of the type: the code is made for it
    call(kept, y, z)  # the second full read of this set: stored
    before = CountingTensor.storage_reads
    for i in range(3 * SLOTS):
        x = CountingTensor(0x10_0000 + 0x1000 * i, 300)
        assert call(x, y, z)[0] == (x.ptr, 300)
    assert CountingTensor.storage_reads == before  # nothing stored: no storage read
    reads = Tensor.reads
    assert call(kept, y, z)[0] == (0x4000, 300)
    assert Tensor.reads == reads  # its slot was not evicted by the sets seen once: a hit
    x = CountingTensor(0x9000, 300)
    call(x, y, z)
    assert CountingTensor.storage_reads == before
    call(x, y, z)  # the same objects again: stored now
    assert CountingTensor.storage_reads == before + 3
    reads = Tensor.reads
    assert call(x, y, z)[0] == (0x9000, 300) and Tensor.reads == reads


def test_sets_in_turn_are_each_stored_on_their_second_read(call: Any) -> None:
    y, z = Tensor(0x2000, 300), Tensor(0x3000, 300)
    xs = [Tensor(0x10_0000 + 0x1000 * i, 300) for i in range(SLOTS)]
    for x in xs * 2:
        call(x, y, z)
    reads = Tensor.reads
    for x in xs:
        assert call(x, y, z)[0] == (x.ptr, 300)
    assert Tensor.reads == reads  # every one a hit


def test_a_uniform_in_a_tensor_is_read_inline(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A struct in a torch tensor (what khal_runtime.torch.uniform() makes): the call reads it
    inline (pointer, elements times itemsize), not through the generic converter, once the plan
    has seen the type; too few bytes is still the named error."""
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    plan = k.plan(0)
    generic: list[int] = []
    real = plan._uniform_unseen
    monkeypatch.setattr(plan, "_uniform_unseen", lambda i, obj, gen: (generic.append(i), real(i, obj, gen))[1])
    x, y, z = Tensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    for j in range(6):
        u = Tensor(0x7000 + 0x100 * j, 2)  # two float32: the struct's 8 bytes; a new one each call
        k(300, x, y, z, u, 0.5, stream=st)
        assert _u64(fake.launches[-1], 6) == u.ptr
    assert len(generic) <= 1  # the first call only (the plan learns the type from it)
    with pytest.raises(ArgumentValueError, match=r"argument 'p'"):
        k(300, x, y, z, Tensor(0x7000, 1), 0.5, stream=st)  # 4 bytes, the struct needs 8
    assert len(generic) <= 1


def test_the_memo_keeps_the_storage_a_tensor_had(call: Any) -> None:
    """After ``.data =`` frees a tensor's old memory, an allocator could hand that address to
    new data with the same pointer: the memo holds the old storage, so it cannot."""
    x, y, z = Tensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    old = weakref.ref(x.storage)
    call(x, y, z)  # first sight of the type: the launch code is regenerated for it
    call(x, y, z)  # remembered (the second full read of this set)
    x.set_data(0x5000, 300)
    gc.collect()
    assert old() is not None  # held by the memo slot that packed it
    assert call(x, y, z)[0] == (0x5000, 300)


@pytest.mark.parametrize("repeats", [3, PROMOTE_AFTER + 3], ids=["memo slot", "shared snapshot"])
def test_inference_tensors_are_remembered_by_pointer_count_dtype_and_contiguity(call: Any, repeats: int) -> None:
    """#38 item 19: an inference tensor has no version counter; what an in-place op can change
    under the same identity (``resize_``, ``t_``, ``.data =``) is compared instead, and a repeat
    reads nothing else (it was read in full on every launch)."""
    x, y, z = InferenceTensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    for _ in range(repeats):
        call(x, y, z)
    before = Tensor.reads
    assert call(x, y, z)[0] == (0x1000, 300)
    assert Tensor.reads == before + 1  # x's count compared, no full read of the set (y, z by version)
    x.n = 100  # resize_ in inference mode: no version to bump
    assert call(x, y, z)[0] == (0x1000, 100)
    x.contiguous = False  # t_() in inference mode: the same pointer and count
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*non-contiguous"):
        call(x, y, z)
    x.contiguous = True
    assert call(x, y, z)[0] == (0x1000, 100)
    x.dtype = "int32"  # .data = a view of another dtype at the same address
    with pytest.raises(TypeError, match=r"argument 'x'.*expected element type float32.*int32"):
        call(x, y, z)
    x.dtype, x.ptr = "float32", 0x9000
    assert call(x, y, z)[0] == (0x9000, 100)
    assert InferenceTensor.version_reads == 0


@pytest.mark.parametrize("repeats", [2, PROMOTE_AFTER + 3], ids=["memo slot", "shared snapshot"])
def test_a_remembered_tensor_swapped_with_an_inference_tensor(call: Any, repeats: int) -> None:
    """Its version can no longer be read: the launch reads it in full instead of failing, and
    the memo that held it is dropped (so no later launch pays for the error again)."""
    x, y, z = SwappableTensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    for _ in range(repeats):
        call(x, y, z)
    x.inference, x.ptr, x.n = True, 0x8000, 100  # what torch.utils.swap_tensors(x, t) does
    assert call(x, y, z)[0] == (0x8000, 100)
    reads = SwappableTensor.version_reads
    for _ in range(3):
        assert call(x, y, z)[0] == (0x8000, 100)
    assert SwappableTensor.version_reads == reads


def test_an_inference_tensor_after_versioned_ones_is_learnt_then_remembered(call: Any) -> None:
    """The call's code was made for versioned tensors (no branch for a tensor without a version):
    the first inference tensor it would store is learnt instead, the kernel takes the call made for
    it, and its repeats are remembered, never reading its ``_version``."""
    x, y, z = Tensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    for _ in range(3):
        call(x, y, z)
    plan = call.kernel.plan(0)
    assert not plan._unversioned and "UNVERSIONED else" not in plan.call_source
    w = InferenceTensor(0x4000, 300)
    for _ in range(3):
        assert call(w, y, z)[0] == (0x4000, 300)
    assert plan._unversioned == {0} and "a0._version == ver if ver is not UNVERSIONED else" in plan.call_source
    before = Tensor.reads
    assert call(w, y, z)[0] == (0x4000, 300)
    assert Tensor.reads == before + 1  # a hit: w's count compared, no full read
    w.n = 50
    assert call(w, y, z)[0] == (0x4000, 50)
    assert call(x, y, z)[0] == (0x1000, 300) and InferenceTensor.version_reads == 0


@pytest.mark.parametrize("repeats", [2, PROMOTE_AFTER + 3], ids=["memo slot", "shared snapshot"])
def test_a_dtype_changed_at_the_same_address_is_read_again(call: Any, repeats: int) -> None:
    """#38 item 4: ``t.data = t.data.view(torch.int32)`` keeps the version and the address; a
    remembered float32 launch is not repeated on int32 data."""
    x, y, z = Tensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    for _ in range(repeats):
        call(x, y, z)
    x.dtype = "int32"  # what .data = x.data.view(torch.int32) does (the version is kept)
    with pytest.raises(TypeError, match=r"argument 'x'.*expected element type float32.*got int32"):
        call(x, y, z)
    x.dtype = "float32"
    assert call(x, y, z)[0] == (0x1000, 300)


def test_a_tensor_without_memory_is_refused(call: Any) -> None:
    """``untyped_storage().resize_(0)`` (as FSDP does) leaves a tensor with elements and a null
    pointer: a named error, nothing launched."""
    x, y, z = Tensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    call(x, y, z)
    x.set_data(0, 300)
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*300 elements with no memory"):
        call(x, y, z)
    x.set_data(0, 0)  # an empty tensor may have no memory
    assert call(x, y, z)[0] == (0, 0)


def test_a_parameter_given_device_buffers_and_tensors(call: Any) -> None:
    d = DeviceBuffer(0x7000, 300, "float32", 0)
    x, y, z = Tensor(0x1000, 300), Tensor(0x2000, 300), Tensor(0x3000, 300)
    for _ in range(3):
        assert call(d, y, z)[0] == (0x7000, 300)
        assert call(x, y, z)[0] == (0x1000, 300)
    x.resize_(5)
    assert call(x, y, z)[0] == (0x1000, 5)
    assert call(d, y, z)[0] == (0x7000, 300)


# -- real torch ----------------------------------------------------------------------------------
def _torch_on_cpu() -> Any:
    """torch, and a Tensor subclass that passes the runtime's device check on CPU (the runtime
    reads it as torch: its module starts with "torch"). The fake driver never touches memory."""
    torch = pytest.importorskip("torch")

    class CudaLooking(torch.Tensor):
        is_cuda = True

        def get_device(self) -> int:
            return 0

    CudaLooking.__module__ = "torch.khal_test"
    return torch, lambda t: t.as_subclass(CudaLooking)


def test_real_torch_in_place_changes_and_data_assignment(call: Any) -> None:
    torch, cuda = _torch_on_cpu()
    x, y, z = (cuda(torch.zeros(300)) for _ in range(3))

    def now(t: Any) -> tuple[int, int]:
        return t.data_ptr(), t.numel()

    for _ in range(PROMOTE_AFTER + 2):
        assert call(x, y, z) == (now(x), now(y), now(z))
    y.resize_(200)  # shrinks in place: same pointer
    assert call(x, y, z)[1] == now(y) and now(y)[1] == 200
    z.data = torch.ones(400)  # another tensor's memory
    assert call(x, y, z)[2] == now(z) and now(z)[1] == 400
    x.add_(1)  # data only: repacking is harmless
    assert call(x, y, z) == (now(x), now(y), now(z))
    with torch.no_grad():
        y.resize_(250)
    assert call(x, y, z)[1] == (y.data_ptr(), 250)
    with torch.inference_mode():
        y.resize_(260)
    assert call(x, y, z)[1] == (y.data_ptr(), 260)
    with torch.inference_mode():
        w = cuda(torch.zeros(300))  # an inference tensor: no version, read every launch
    for _ in range(3):
        assert call(w, y, z)[0] == now(w)
    with torch.inference_mode():
        w.resize_(100)
    assert call(w, y, z)[0] == (w.data_ptr(), 100)
    y.untyped_storage().resize_(0)  # its memory freed under it
    with pytest.raises(ArgumentValueError, match=r"argument 'y'.*with no memory"):
        call(x, y, z)
    y.data = torch.zeros(260)
    x.resize_(15, 20).t_()  # transposed in place: no longer contiguous
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*non-contiguous tensor"):
        call(x, y, z)


def test_real_torch_a_dtype_view_assigned_to_data_is_read_again(call: Any) -> None:
    torch, cuda = _torch_on_cpu()
    x, y, z = (cuda(torch.zeros(300)) for _ in range(3))
    for _ in range(PROMOTE_AFTER + 2):
        call(x, y, z)
    v, ptr = x._version, x.data_ptr()
    x.data = x.data.view(torch.int32)
    assert (x._version, x.data_ptr()) == (v, ptr)  # nothing else tells it
    with pytest.raises(TypeError, match=r"argument 'x'.*expected element type float32.*got int32"):
        call(x, y, z)
    with torch.inference_mode():
        w = cuda(torch.zeros(300))
    for _ in range(PROMOTE_AFTER + 2):  # an inference tensor is remembered by its facts (#38 item 19)
        assert call(w, y, z)[0] == (w.data_ptr(), 300)
    w.data = w.data.view(torch.int32)
    with pytest.raises(TypeError, match=r"argument 'x'.*got int32"):
        call(w, y, z)
    with torch.inference_mode():
        u = cuda(torch.zeros(300))
        for _ in range(3):
            call(u, y, z)
        u.resize_(100)  # in place, no version: the count is compared
        assert call(u, y, z)[0] == (u.data_ptr(), 100)
        u.resize_(10, 10).t_()  # transposed in place: the same pointer and count
        with pytest.raises(ArgumentValueError, match=r"argument 'x'.*non-contiguous"):
            call(u, y, z)


def test_real_torch_a_new_tensor_each_call_is_never_stored(call: Any) -> None:
    torch, cuda = _torch_on_cpu()
    y, z = cuda(torch.zeros(300)), cuda(torch.zeros(300))
    call(cuda(torch.zeros(300)), y, z)  # first sight of the type
    news = []
    for _ in range(2 * SLOTS):
        x = cuda(torch.zeros(300))
        news.append(x)
        assert call(x, y, z)[0] == (x.data_ptr(), 300)
    slots = call.kernel.plan(0)._tls.s.all
    assert not any(m.a0 is x for m in slots for x in news)  # no slot holds a set seen once
    call(news[-1], y, z)  # the second full read of these objects (one of the last SLOTS): stored
    assert any(m.a0 is news[-1] and m.storage0 is not None for m in slots)
