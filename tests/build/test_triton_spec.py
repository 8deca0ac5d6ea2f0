"""khal_runtime.triton_spec against Triton's own: ``native_specialize_impl(CUDABackend, value, is_const,
specialize, align)`` and the binder ``create_function_from_signature`` makes from a kernel's annotations
(Triton 3.6, installed in the test environment), over many values: ints around every boundary, negative,
0, 1, 16, 2**31, 2**63, bools, floats, None, int subclasses, and fake tensors of many dtypes and
alignments."""

from __future__ import annotations

import enum
import inspect
from typing import Any

import numpy as np
import pytest

from khal_runtime.manifest import TritonParam
from khal_runtime.triton_spec import SpecError, specialize_param, specialize_value

pytestmark = pytest.mark.needs_triton


class _Dtype:
    """A torch-like dtype: ``str()`` is ``torch.<name>``; kept alive (Triton caches by its hash)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


_TORCH_NAMES = ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8",
                "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz")
DTYPES: list[Any] = [_Dtype(n) for n in _TORCH_NAMES] + [np.dtype(n) for n in (
    "float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")]


class _Tensor:
    def __init__(self, ptr: int, dtype: Any) -> None:
        self._ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self._ptr

    def __repr__(self) -> str:
        return f"<tensor {self.dtype} at {self._ptr:#x}>"


class _Color(enum.IntEnum):
    ONE = 1
    SIXTEEN = 16
    SEVEN = 7


class _MyInt(int):
    pass


def _ints() -> list[int]:
    out = {0, 1, 2, 15, 16, 17, 32, 48, 1024, 4096, 4095, 100, -1, -15, -16, -17, -32}
    for b in (31, 32, 63, 64):
        for d in (-17, -16, -15, -1, 0, 1, 15, 16, 17):
            out.add((1 << b) + d)
            out.add(-(1 << b) + d)
    return sorted(out)


def _values() -> list[Any]:
    vals: list[Any] = [*_ints(), True, False, 0.0, 1.0, -2.5, float("inf"), None, _Color.ONE, _Color.SIXTEEN,
                       _Color.SEVEN, _MyInt(1), _MyInt(32), _MyInt(33), np.float64(1.0)]
    for d in DTYPES:
        for p in (0, 0x1000, 0x1004, 0x1008, 0x100C, 0x1010, 0x7F00_0000_0002, (1 << 63) + 16):
            vals.append(_Tensor(p, d))
    return vals


FLAGS = [(c, s, a) for c in (False, True) for s in (False, True) for a in (False, True)]


def _theirs(value: Any, is_const: bool, specialize: bool, align: bool) -> Any:
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl

    try:
        return native_specialize_impl(CUDABackend, value, is_const, specialize, align)
    except (TypeError, OverflowError, KeyError) as exc:
        return type(exc)


def _ours(value: Any, is_const: bool, specialize: bool, align: bool) -> Any:
    try:
        return specialize_value(value, specialize, align, is_const)
    except SpecError:
        return "error"


def test_the_specialisation_of_every_value_is_tritons() -> None:
    checked = 0
    for v in _values():
        for is_const, spec, align in FLAGS:
            want = _theirs(v, is_const, spec, align)
            got = _ours(v, is_const, spec, align)
            if isinstance(want, type):  # Triton refuses it: so do we
                assert got == "error", (v, is_const, spec, align, want, got)
            else:
                assert got == want and type(got[1]) is type(want[1]), (v, is_const, spec, align, want, got)
            checked += 1
    assert checked > 1500


def test_values_triton_refuses_are_refused() -> None:
    for v in ("mean", 1 << 64, -(1 << 63) - 1, b"x", object()):
        assert _theirs(v, False, True, True) in (TypeError, OverflowError)
        with pytest.raises(SpecError):
            specialize_value(v)


def _kernel_params(fn: Any, dns: tuple[str, ...] = (), dnsa: tuple[str, ...] = ()) -> tuple[list[Any], list[Any]]:
    """Triton's KernelParams of ``fn`` and the TritonParams the build records for them."""
    from triton.runtime.jit import KernelParam

    sig = inspect.signature(fn)
    kps = [KernelParam(i, p, p.name in dns, p.name in dnsa) for i, p in enumerate(sig.parameters.values())]
    tps = [TritonParam(name=kp.name, constexpr=kp.is_constexpr, do_not_specialize=kp.do_not_specialize,
                       do_not_specialize_on_alignment=kp.do_not_specialize_on_alignment,
                       annotation=kp.annotation_type) for kp in kps]
    return kps, tps


def test_the_binders_specialisation_per_parameter_is_tritons() -> None:
    """Annotations (``tl.int64``, ``"*fp16"``, ``tl.float32``, ``"u1"``), constexprs,
    do_not_specialize and do_not_specialize_on_alignment, as the JIT's binder handles them."""
    import triton.language as tl
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    def k(a, b: tl.int64, c: "*fp16", d: tl.float32, e: "u1", f, g, h: tl.constexpr, i: "i32"):  # type: ignore
        pass

    kps, tps = _kernel_params(k, dns=("f",), dnsa=("g",))
    binder = create_function_from_signature(inspect.signature(k), kps, CUDABackend)
    tensors = [_Tensor(p, DTYPES[1]) for p in (0x1000, 0x1004)]
    cases = [*_ints()[:40], 1, 16, 17, 2**31, 2**31 + 16, True, 0.5, None, *tensors]
    checked = 0
    for v in cases:
        for j in range(len(tps)):
            args: list[Any] = [0x10] * len(tps)
            args[j] = v
            try:
                _, want, _ = binder(*args)
            except (TypeError, OverflowError):
                continue  # a value the annotation cannot take (a tensor for tl.int64, ...)
            try:
                got = specialize_param(v, tps[j])
            except SpecError:
                pytest.fail(f"{tps[j].name}={v!r}: Triton gives {want[j]}, we refused it")
            assert got == tuple(want[j]), (tps[j].name, v, want[j], got)
            checked += 1
    assert checked > 300
