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
from tests.helpers.runtime import Tensor
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar, storage, uniform  # noqa: F401


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


# -- a __cuda_array_interface__ / DLPack producer, honest or not ------------------------------------
class Cai:
    """An object whose ``__cuda_array_interface__`` is ``cai`` (whatever it is)."""

    def __init__(self, cai: Any) -> None:
        self._cai = cai

    @property
    def __cuda_array_interface__(self) -> Any:
        return self._cai


def cai(ptr: Any = 0x200000, shape: Any = (1024,), readonly: Any = False, typestr: Any = "<f4", **kw: Any) -> Cai:
    d = {"version": 3, "shape": shape, "typestr": typestr, "data": (ptr, readonly), "strides": None}
    d.update(kw)
    return Cai(d)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DL:
    """A CUDA DLPack producer of ``n`` float32 at ``ptr``: DLPack 1.0 (versioned capsules, with
    flags) when asked with ``max_version`` and ``versioned``, else the legacy capsule;
    ``name`` overrides the capsule's name (``used_dltensor``: already consumed), ``ret`` what
    ``__dlpack__`` returns."""

    def __init__(self, ptr: int = 0x200000, n: int = 1024, *, versioned: bool = True, readonly: bool = False,
                 byte_offset: int = 0, name: bytes | None = None, ret: Any = None, device: Any = (2, 0)) -> None:
        self.ptr, self.n, self.versioned, self.readonly = ptr, n, versioned, readonly
        self.byte_offset, self.name, self.ret, self.device = byte_offset, name, ret, device
        self._keep: list[Any] = []

    def __dlpack_device__(self) -> Any:
        return self.device

    def _tensor(self) -> _DLTensor:
        shape = (ctypes.c_int64 * 1)(self.n)
        self._keep.append(shape)
        return _DLTensor(self.ptr, _DLDevice(2, 0), 1, _DLDataType(2, 32, 1),
                         ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), None, self.byte_offset)

    def __dlpack__(self, stream: Any = None, max_version: Any = None, **kw: Any) -> Any:
        if self.ret is not None:
            return self.ret
        if self.versioned and max_version is not None and max_version[0] >= 1:
            m: Any = _DLManagedTensorVersioned(1, 0, None, None, 1 if self.readonly else 0, self._tensor())
            name = b"dltensor_versioned"
        else:
            m = _DLManagedTensor(self._tensor(), None, None)
            name = b"dltensor"
        name = self.name or name
        self._keep += [m, name]
        return _capsule_new(ctypes.addressof(m), name, None)


def _every_path(ks: Any, fake: FakeDriver, bad: Any, cls: type[Exception], match: str) -> None:
    """``bad`` as argument 'x' of axpby is refused with ``cls`` matching ``match`` on every path:
    check_args, the typed call (generic path, then generated code), launch() and bind()."""
    y, p = _buf(0x400000), Params(1, 2)
    full = rf"axpby\(\): argument 'x' \(storage float32\).*{match}"
    with pytest.raises(cls, match=full):
        ks.axpby.check_args(bad, y, p, 0.5)
    for _ in range(2):
        with pytest.raises(cls, match=full):
            ks.axpby(4, bad, y, p, 0.5)
    with pytest.raises(cls, match=full):
        ks.axpby.launch(1, None, bad, y, p, 0.5)
    with pytest.raises(cls, match=full):
        ks.axpby.bind(bad, y, p, 0.5)
    assert fake.launches == []


# -- item 6: lying or broken interfaces ----------------------------------------------------------
_LIES = [
    (Cai({"shape": (4,), "typestr": "<f4", "data": None, "version": 3}), r"data"),
    (Cai({"typestr": "<f4", "data": (0x200000, False), "version": 3}), r"shape"),
    (Cai([("shape", (4,)), ("typestr", "<f4")]), r"__cuda_array_interface__ .*list.*not a dict"),
    (cai(ptr=-4096), r"pointer -4096"),
    (cai(ptr=2**64), r"pointer 18446744073709551616"),
    (cai(shape=(2**35, 2**35)), r"1180591620717411303424 elements"),
    (cai(shape=(2**62,)), r"4611686018427387904 elements"),  # fits u64, its bytes do not
    (cai(ptr="0x200000"), r"pointer '0x200000'"),
    (cai(typestr=4), r"typestr 4"),
    (cai(strides=5), r"strides 5"),
    (Cai({"shape": (4,), "typestr": "<f4", "data": (0x200000,), "version": 3}), r"data"),
    (DL(name=b"used_dltensor"), r"already consumed"),
    (DL(name=b"used_dltensor_versioned"), r"already consumed"),
    (DL(ret=42), r"__dlpack__\(\) returned int"),
    (DL(device=None), r"__dlpack_device__\(\)"),
    (DL(name=b"something"), r"capsule named 'something'"),
]


class _Raising:
    @property
    def __cuda_array_interface__(self) -> Any:
        raise RuntimeError("the producer fell over")


@pytest.mark.parametrize("bad,match", _LIES + [(_Raising(), "RuntimeError: the producer fell over")],
                         ids=[f"lie{i}" for i in range(len(_LIES) + 1)])
def test_a_lying_or_broken_interface_is_a_named_error(ks: Any, fake: FakeDriver, bad: Any, match: str) -> None:
    _every_path(ks, fake, bad, (ArgumentError, ArgumentValueError), match)  # type: ignore[arg-type]


def test_an_honest_dlpack_producer_is_accepted_both_versions(ks: Any, fake: FakeDriver) -> None:
    y, p = _buf(0x400000), Params(1, 2)
    ks.axpby(4, DL(), y, p, 0.5)
    ks.axpby(4, DL(versioned=False), y, p, 0.5)
    ks.axpby(4, DL(byte_offset=256), y, p, 0.5)
    assert len(fake.launches) == 3


# -- item 5: read-only arrays for writable bindings -------------------------------------------------
_READ_ONLY = [(cai(readonly=True), r"read-only"), (DL(readonly=True), r"read-only")]


@pytest.mark.parametrize("ro,match", _READ_ONLY, ids=["cai", "dlpack"])
def test_a_read_only_array_is_refused_for_a_writable_binding(ks: Any, fake: FakeDriver, ro: Any, match: str) -> None:
    x, p = _buf(0x400000), Params(1, 2)
    full = rf"axpby\(\): argument 'y' \(storage float32\).*{match}.*writes"
    with pytest.raises(ArgumentError, match=full):
        ks.axpby.check_args(x, ro, p, 0.5)
    for _ in range(2):
        with pytest.raises(ArgumentError, match=full):
            ks.axpby(4, x, ro, p, 0.5)
    with pytest.raises(ArgumentError, match=full):
        ks.axpby.launch(1, None, x, ro, p, 0.5)
    with pytest.raises(ArgumentError, match=full):
        ks.axpby.bind(x, ro, p, 0.5)
    assert fake.launches == []
    # for the read-only binding it is fine, on every path
    ks.axpby.check_args(ro, x, p, 0.5)
    ks.axpby(4, ro, x, p, 0.5)
    ks.axpby(4, ro, x, p, 0.5)
    ks.axpby.launch(1, None, ro, x, p, 0.5)
    ks.axpby.bind(ro, x, p, 0.5)(4)
    assert len(fake.launches) == 4


# -- item 7: misaligned arrays ---------------------------------------------------------------------
_MISALIGNED = [
    (cai(ptr=0x200001), "0x200001"),
    (cai(ptr=0x200002), "0x200002"),
    (DL(byte_offset=2), "0x200002"),
    (DL(versioned=False, byte_offset=1), "0x200001"),
    (DeviceBuffer(0x200001, 64, "float32", 0), "0x200001"),
]


@pytest.mark.parametrize("bad,at", _MISALIGNED, ids=["cai1", "cai2", "dlpack-offset", "dlpack-legacy", "devicebuffer"])
def test_a_misaligned_array_is_refused_on_every_path(ks: Any, fake: FakeDriver, bad: Any, at: str) -> None:
    _every_path(ks, fake, bad, ArgumentValueError,
                rf"starts at {at}, not a multiple of 4 bytes \(the alignment of float32\).*MISALIGNED")


def test_a_misaligned_tensor_is_refused_after_an_aligned_one_was_inlined(ks: Any, fake: FakeDriver) -> None:
    from tests.helpers.runtime import VersionedTensor

    y, p = _buf(0x400000), Params(1, 2)
    for t in (Tensor(0x9000, 16), VersionedTensor(0x9000, 16)):
        ks.axpby(4, t, y, p, 0.5)
        ks.axpby(4, t, y, p, 0.5)  # inlined read / memo hit
    n = len(fake.launches)
    for t in (Tensor(0x9002, 16), VersionedTensor(0x9002, 16)):
        with pytest.raises(ArgumentValueError, match=r"axpby\(\): argument 'x'.*starts at 0x9002"):
            ks.axpby(4, t, y, p, 0.5)
    moved = VersionedTensor(0x9000, 16)
    ks.axpby(4, moved, y, p, 0.5)
    ks.axpby(4, moved, y, p, 0.5)
    moved.ptr = 0x9003  # .data = ...: the memo sees the new pointer, and the read checks it
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*starts at 0x9003"):
        ks.axpby(4, moved, y, p, 0.5)
    assert len(fake.launches) == n + 2


def test_struct_elements_are_checked_against_their_own_alignment(fake: FakeDriver, tmp_path: Any) -> None:
    import numpy as np

    dt = np.dtype([("a", "<f8"), ("b", "<f8")])
    from khal_runtime.manifest import Param

    v = Param(name="v", kind="storage", element_type="Pair", element_size=16, element_align=8, shape="slice",
              writable=True)
    e = make_entry("pairs", (v,))
    ks = fake_kernels(fake, tmp_path, [e])
    ks.pairs(4, cai(ptr=0x200008, typestr="|V16", descr=dt.descr))
    with pytest.raises(ArgumentValueError, match=r"pairs\(\): argument 'v'.*0x200004, not a multiple of 8 bytes"):
        ks.pairs(4, cai(ptr=0x200004, typestr="|V16", descr=dt.descr))
    assert len(fake.launches) == 1


def test_the_generated_code_checks_every_storage_in_one_test(ks: Any) -> None:
    plan = ks.axpby.plan(0)
    lines = [ln.strip() for ln in plan.source.splitlines() if "& 3" in ln]
    # the storages, and the uniform where it is a device pointer (not on the host-bytes branch)
    assert lines == ["if u[1] < 8 or u[0] & 3: raise Short()", "if (p0 | p1) & 3: raise Short()"], lines


def test_a_misaligned_or_read_only_indirect_count_is_refused(fake: FakeDriver) -> None:
    from khal_runtime.backends.cuda import indirect
    from khal_runtime.device import Device

    st = Device(0).default_stream
    for bad in (cai(ptr=0x200002, typestr="<u4", shape=(1,)), DeviceBuffer(0x200001, 1, "uint32", 0)):
        with pytest.raises(ArgumentValueError, match=r"dispatch_indirect: count: the array starts at 0x20000[12], "
                                                     r"not a multiple of 4 bytes"):
            indirect._count_ptr(bad)
        with pytest.raises(ArgumentValueError, match=r"dispatch_indirect: threads.*not a multiple of 4"):
            indirect.threads_to_groups(bad, 256, stream=st)
    ro = cai(ptr=0x200000, typestr="<u4", shape=(1,), readonly=True)
    assert indirect._count_ptr(ro) == 0x200000  # read: fine
    with pytest.raises(ArgumentError, match=r"dispatch_indirect: out is a read-only array"):
        indirect.threads_to_groups(DeviceBuffer(0x300000, 1, "uint32", 0), 256, out=ro, stream=st)
    with pytest.raises(ArgumentError, match=r"dispatch_indirect: count: reading it as a device array"):
        indirect._count_ptr(_Raising())
    assert fake.launches == []


# -- the same for a uniform given as a device array holding the struct --------------------------------
@pytest.mark.parametrize("bad,cls,match", [
    (Cai([("shape", (8,))]), ArgumentError, r"not a dict"),
    (_Raising(), ArgumentError, r"RuntimeError: the producer fell over"),
    (DL(ret=42), ArgumentError, r"__dlpack__\(\) returned int"),
    (cai(ptr=0x200002, typestr="|u1", shape=(8,)), ArgumentValueError,
     r"starts at 0x200002, not a multiple of 4 bytes \(the alignment of struct Params\)"),
], ids=["list", "raising", "dlpack42", "misaligned"])
def test_a_uniform_in_device_memory_is_read_with_the_same_checks(ks: Any, fake: FakeDriver, bad: Any,
                                                                  cls: type[Exception], match: str) -> None:
    x, y = _buf(0x400000), _buf(0x500000)
    full = rf"axpby\(\): argument 'p' \(uniform Params.*{match}"
    with pytest.raises(cls, match=full):
        ks.axpby.check_args(x, y, bad, 0.5)
    for _ in range(2):
        with pytest.raises(cls, match=full):
            ks.axpby(4, x, y, bad, 0.5)
    with pytest.raises(cls, match=full):
        ks.axpby.bind(x, y, bad, 0.5)
    assert fake.launches == []
    ks.axpby(4, x, y, cai(ptr=0x200004, typestr="|u1", shape=(8,)), 0.5)
    assert len(fake.launches) == 1


@pytest.mark.parametrize("got,match", [((-4096, 4, "float32"), r"pointer -4096 and 4 elements, outside"),
                                       ((0x200000, 2**70, "float32"), r"1180591620717411303424 elements, outside"),
                                       ((0x200000, 2**62, "float32"), r"run past the 64-bit address space"),
                                       ((0x200000, 4.0, "float32"), r"element count 4.0, not integers")],
                         ids=["negative", "huge", "past-the-end", "float-count"])
def test_a_registered_extractor_that_lies_is_a_named_error(ks: Any, fake: FakeDriver, got: Any, match: str) -> None:
    """The class, not only the built-in records: whatever an extractor returns is range-checked
    before it reaches struct packing (which raised a bare struct.error)."""
    from khal_runtime.interop import register_array_type

    class Liar:
        pass

    register_array_type(Liar, lambda obj: got)
    _every_path(ks, fake, Liar(), ArgumentError if "not integers" in match else ArgumentValueError, match)


def test_a_graph_rebound_to_a_misaligned_array_is_refused(ks: Any, fake: FakeDriver) -> None:
    from khal_runtime import graphs
    from khal_runtime.device import Device

    st = Device(0).default_stream
    pdev = DeviceBuffer(0x700000, 8, "uint8", 0)  # the uniform in device memory: nothing to upload

    def step(x: Any, y: Any) -> None:
        ks.axpby(256, x, y, pdev, 0.5, stream=st)

    g = graphs.capture_graph(step, _buf(0x200000), _buf(0x300000), stream=st)
    n = len(fake.launches)
    with pytest.raises(ArgumentValueError, match=r"axpby\(\): argument 'x'.*starts at 0x200001"):
        g.rebind(cai(ptr=0x200001), _buf(0x300000))
    with pytest.raises(ArgumentError, match=r"axpby\(\): argument 'y'.*read-only"):
        g.rebind(_buf(0x200000), cai(ptr=0x300000, readonly=True))
    assert len(fake.launches) == n
    assert g.rebind(_buf(0x400000), _buf(0x500000)) is True
