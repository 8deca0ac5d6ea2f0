"""Argument packing for WebGPU, without a GPU: layouts, repacking, dicts, scalars."""

from __future__ import annotations

import ctypes
import math
import struct

import numpy as np
import pytest

from khal_runtime.packing import (
    Repacker,
    ScalarPacker,
    UniformPacker,
    leaves,
    pack_cuda,
    pack_dict,
)
from khal_runtime.errors import ArgumentError, ArgumentValueError, KhalError
from khal_runtime.manifest import Param, ScalarSlot, StructField, StructLayout, WebGpuTarget
from tests.runtime.webgpu._kernels import CUDA_PARAMS, WGSL_PARAMS, params_ctypes, params_dtype

VALUES = {"a": 1.5, "b": -7, "v": [1.0, 2.0, 3.0, 4.0], "w": (5.0, 6.0, 7.0), "n": 42, "c": np.array([8.0, 9.0])}


def _param() -> Param:
    return Param(name="p", kind="uniform", element_type="Params", element_size=64, element_align=16,
                 layouts={"cuda": CUDA_PARAMS, "wgsl": WGSL_PARAMS})


def _wgsl_expected() -> bytes:
    buf = bytearray(80)
    struct.pack_into("<fi", buf, 0, 1.5, -7)
    struct.pack_into("<4f", buf, 16, 1, 2, 3, 4)
    struct.pack_into("<3fI", buf, 32, 5, 6, 7, 42)
    struct.pack_into("<f", buf, 48, 8.0)
    struct.pack_into("<f", buf, 64, 9.0)
    return bytes(buf)


def _ctypes_value() -> ctypes.Structure:
    P = params_ctypes()
    p = P()
    p.a, p.b, p.n = 1.5, -7, 42
    p.v[:] = [1, 2, 3, 4]
    p.w[:] = [5, 6, 7]
    p.c[:] = [8, 9]
    return p


def test_leaves_flatten_vectors_and_std140_arrays() -> None:
    lw = {x.path: x.offset for x in leaves(WGSL_PARAMS)}
    assert lw["v[3]"] == 28 and lw["w[2]"] == 40 and lw["n"] == 44
    assert lw["c[0]"] == 48 and lw["c[1]"] == 64
    lc = {x.path: x.offset for x in leaves(CUDA_PARAMS)}
    assert lc["c[1]"] == 52 and len(lc) == len(lw) == 12


def test_nested_struct_arrays_flatten() -> None:
    inner = (StructField(name="x", type="float32", offset=0, size=4),
             StructField(name="k", type="uint32", offset=4, size=4))
    lay = StructLayout(size=48, fields=(
        StructField(name="s", type="struct", offset=0, size=32, shape=(2,), strides=(16,), fields=inner),
        StructField(name="m", type="float32", offset=32, size=16, shape=(2, 2), strides=(8, 4))))
    paths = [(x.path, x.offset) for x in leaves(lay)]
    assert paths == [("s[0].x", 0), ("s[0].k", 4), ("s[1].x", 16), ("s[1].k", 20),
                     ("m[0][0]", 32), ("m[0][1]", 36), ("m[1][0]", 40), ("m[1][1]", 44)]
    got = pack_dict(lay, {"s": [{"x": 1.0, "k": 2}, {"x": 3.0, "k": 4}], "m": [[5, 6], [7, 8]]})
    assert struct.unpack_from("<fI", got, 16) == (3.0, 4) and struct.unpack_from("<4f", got, 32) == (5, 6, 7, 8)


def test_repack_ctypes_bytes_numpy_dict_agree() -> None:
    up = UniformPacker("read_params", _param(), "wgsl")
    want = _wgsl_expected()
    c = _ctypes_value()
    assert ctypes.sizeof(c) == 64
    assert up.pack(c) == want
    assert up.pack(bytes(c)) == want
    rec = np.zeros((), dtype=params_dtype())
    for k, v in VALUES.items():
        rec[k] = v
    assert up.pack(rec) == want          # a 0-d structured array
    assert up.pack(rec[()]) == want      # a structured scalar (np.void)
    assert up.pack(VALUES) == want       # a dict, straight into the target layout


def test_repack_is_bit_exact() -> None:
    rp = Repacker(CUDA_PARAMS, WGSL_PARAMS)
    src = bytearray(64)
    struct.pack_into("<I", src, 0, 0x7FC00123)  # a NaN with a payload
    struct.pack_into("<f", src, 16, -0.0)
    out = rp.convert(bytes(src))
    assert struct.unpack_from("<I", out, 0)[0] == 0x7FC00123
    assert struct.unpack_from("<I", out, 16)[0] == 0x80000000
    assert Repacker(WGSL_PARAMS, WGSL_PARAMS).convert(b"x" * 80) == b"x" * 80


def test_reordered_fields_repack() -> None:
    src = StructLayout(size=8, fields=(StructField(name="a", type="float32", offset=0, size=4),
                                       StructField(name="b", type="uint32", offset=4, size=4)))
    dst = StructLayout(size=16, fields=(StructField(name="a", type="float32", offset=8, size=4),
                                        StructField(name="b", type="uint32", offset=0, size=4)))
    out = Repacker(src, dst).convert(struct.pack("<fI", 2.5, 9))
    assert struct.unpack("<I4xf4x", out) == (9, 2.5)


def test_pack_cuda_matches_ctypes() -> None:
    assert pack_cuda(CUDA_PARAMS, VALUES) == bytes(_ctypes_value())


def test_bool_widens_to_a_word() -> None:
    c = StructLayout(size=2, fields=(StructField(name="f", type="bool", offset=0, size=1),
                                     StructField(name="g", type="uint8", offset=1, size=1)))
    w = StructLayout(size=16, fields=(StructField(name="f", type="bool", offset=0, size=4),
                                      StructField(name="g", type="uint8", offset=4, size=1)))
    assert Repacker(c, w).convert(b"\x01\x07")[:5] == b"\x01\0\0\0\x07"
    assert pack_dict(w, {"f": True, "g": 3})[:5] == b"\x01\0\0\0\x03"
    with pytest.raises(ArgumentError, match="'f'.*bool"):
        pack_dict(w, {"f": 1, "g": 3})


@pytest.mark.parametrize("value, cls, match", [
    ({"a": 1.0}, ArgumentError, r"missing field\(s\) 'b', 'v', 'w', 'n', 'c'"),
    ({**VALUES, "zz": 1}, ArgumentError, r"unknown field\(s\) 'zz'"),
    ({**VALUES, "v": [1.0, 2.0]}, ArgumentValueError, r"field 'v' \(float32\[4\]\) expects 4 item\(s\).*got 2"),
    ({**VALUES, "n": -1}, ArgumentValueError, r"field 'n' \(uint32\).*out of range"),
    ({**VALUES, "b": 1.5}, ArgumentError, r"field 'b' \(int32\): expected an integer"),
    ({**VALUES, "a": "1"}, ArgumentError, r"field 'a' \(float32\): expected a number"),
    ({**VALUES, "a": [1.0]}, ArgumentValueError, r"field 'a' is one float32"),
])
def test_dict_errors_name_entry_param_field(value: dict, cls: type, match: str) -> None:
    up = UniformPacker("read_params", _param(), "wgsl")
    with pytest.raises(cls, match=match) as ei:
        up.pack(value)
    assert "read_params(): argument 'p' (uniform Params)" in str(ei.value)


def test_nested_dict_errors() -> None:
    inner = (StructField(name="x", type="float32", offset=0, size=4),)
    lay = StructLayout(size=16, fields=(StructField(name="s", type="struct", offset=0, size=4, fields=inner),))
    with pytest.raises(ArgumentError, match=r"unknown field\(s\) 's.y'"):
        pack_dict(lay, {"s": {"x": 1.0, "y": 2.0}}, "k(): argument 'p'")
    with pytest.raises(ArgumentError, match=r"field 's' is a struct: expected a dict"):
        pack_dict(lay, {"s": 3.0}, "k(): argument 'p'")


def test_wrong_sizes_and_types_of_host_structs() -> None:
    up = UniformPacker("read_params", _param(), "wgsl")
    with pytest.raises(ArgumentValueError, match=r"expected 64 bytes \(the struct's C layout\), got 80"):
        up.pack(b"\0" * 80)
    with pytest.raises(ArgumentError, match="NumPy array of 2 elements"):
        up.pack(np.zeros(2, dtype=params_dtype()))
    with pytest.raises(ArgumentError, match="expected the struct as a dict"):
        up.pack(3.0)


def test_missing_target_layout_is_named() -> None:
    p = Param(name="p", kind="uniform", element_type="Params", element_size=64, element_align=16,
              layouts={"cuda": CUDA_PARAMS})
    with pytest.raises(KhalError, match="no wgsl layout"):
        UniformPacker("k", p, "wgsl")


def _target(slots: tuple[ScalarSlot, ...], size: int) -> WebGpuTarget:
    return WebGpuTarget(target="spirv", path="k.spv", entry_point="k_khal_0123456789abcdef", bindings=(),
                        scalars="push_constants", scalar_block_size=size, scalar_slots=slots)


def _s(name: str, et: str, size: int) -> Param:
    return Param(name=name, kind="scalar", element_type=et, element_size=size, element_align=size)


def test_scalar_block_offsets_and_order() -> None:
    params = [_s("a", "float32", 4), _s("n", "uint32", 4), _s("k", "int32", 4), _s("h", "float16", 2)]
    t = _target((ScalarSlot(param="a", offset=8, size=4), ScalarSlot(param="n", offset=0, size=4),
                 ScalarSlot(param="k", offset=4, size=4), ScalarSlot(param="h", offset=12, size=2)), 16)
    sp = ScalarPacker("k", params, t)
    out = sp.pack([2.5, 7, -3, 1.5])
    assert struct.unpack("<Iife2x", out) == (7, -3, 2.5, 1.5)
    assert sp.pack([np.float32(2.5), np.uint32(7), np.int64(-3), np.float64(1.5)]) == out  # NumPy scalars
    assert sp.pack([2.5, 7, -3, 1.5]) == sp.pack([2.5, 7, -3, 1.5])


def test_scalar_errors_use_one_rule_set() -> None:
    params = [_s("a", "float32", 4), _s("n", "uint32", 4)]
    sp = ScalarPacker("k", params, _target((ScalarSlot(param="a", offset=0, size=4),
                                            ScalarSlot(param="n", offset=4, size=4)), 8))
    with pytest.raises(ArgumentValueError, match=r"k\(\): argument 'n' \(scalar uint32\): -1 is out of range"):
        sp.pack([1.0, -1])
    with pytest.raises(ArgumentError, match=r"argument 'n' \(scalar uint32\): expected an integer"):
        sp.pack([1.0, 2.0])
    with pytest.raises(ArgumentError, match=r"argument 'a' \(scalar float32\): expected a number"):
        sp.pack(["1", 2])
    with pytest.raises(ArgumentError, match=r"argument 'n' \(scalar uint32\): expected an integer"):
        sp.pack([1.0, np.True_])
    with pytest.raises(ArgumentValueError, match=r"argument 'a'.*out of range for float32"):
        sp.pack([1e39, 2])
    assert math.isnan(struct.unpack("<f", sp.pack([float("nan"), 1])[:4])[0])


def test_unused_scalar_is_checked_not_packed() -> None:
    params = [_s("a", "float32", 4), _s("unused", "uint32", 4)]
    sp = ScalarPacker("k", params, _target((ScalarSlot(param="a", offset=0, size=4),), 4))
    assert sp.pack([1.0, 5]) == struct.pack("<f", 1.0)
    with pytest.raises(ArgumentValueError, match="'unused'"):
        sp.pack([1.0, -5])


def test_bool_and_small_ints_widen_in_their_slot() -> None:
    params = [_s("f", "bool", 1), _s("i", "int8", 1)]
    sp = ScalarPacker("k", params, _target((ScalarSlot(param="f", offset=0, size=4),
                                            ScalarSlot(param="i", offset=4, size=4)), 8))
    assert struct.unpack("<Ii", sp.pack([True, -2])) == (1, -2)
