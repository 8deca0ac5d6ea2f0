"""Which variant a kernel's own call launches (issue #36 item 2), on the fake driver: the variant with
exactly the JIT's specialisation when it is built, else the most specialised whose assumptions all
hold, argument by argument; ``None`` arguments take the variants compiled with them None; an int of
2**31 or more an i64 variant, else a named error; another dtype its own variant (and back);
``do_not_specialize`` as the JIT has it; an int address for a pointer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from khal_runtime.errors import TritonMissingVariantError

from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, slots, variant

#: k(x, y, out, n, stride, BLOCK: tl.constexpr)
P = [param("x"), param("y"), param("out"), param("n"), param("stride"), param("BLOCK", constexpr=True)]
C = {"BLOCK": 128}
VARIANTS = {
    "A": {"x": "*fp32:16", "y": "*fp32:16", "out": "*fp32:16", "n": "i32:16", "stride": "i32:1"},
    "B": {"x": "*fp32:16", "y": "*fp32", "out": "*fp32:16", "n": "i32", "stride": "i32"},
    "C": {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "stride": "i32"},
    "D": {"x": "*fp32:16", "y": "none", "out": "*fp32:16", "n": "i32:16", "stride": "i32:1"},
    "E": {"x": "*fp32:16", "y": "*fp32:16", "out": "*fp32:16", "n": "i64:16", "stride": "i32:1"},
    "F": {"x": "*fp16:16", "y": "*fp16:16", "out": "*fp16:16", "n": "i32:16", "stride": "i32:1"},
}


def _crate(drv: FakeDriver, tmp: Path) -> tuple[Any, dict[str, str]]:
    es = {k: variant("k", P, a, C) for k, a in VARIANTS.items()}
    return load_crate(drv, tmp, list(es.values())), {e.name: k for k, e in es.items()}


def _which(drv: FakeDriver, names: dict[str, str]) -> str:
    return names[str(drv.launches[-1]["f"]).removeprefix("FUNC:").split("_khal_")[0]]


def test_the_jits_exact_variant_else_the_most_specialised_that_holds_argument_by_argument(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, names = _crate(fake, tmp_path)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    for _ in range(2):  # the first call of each shape, and its repeat
        ks.k[(4,)](x, y, out, 4096, 1, BLOCK=128)
        assert _which(fake, names) == "A"
        assert slots(fake.launches[-1]) == [0x1000, 0x2000, 0x3000, 4096, 0, 0]  # stride compiled in
    # y 4 bytes off and n ragged: the JIT would keep x's and out's alignment and stride == 1; that
    # variant is not built, B keeps x's and out's (the old all-or-nothing twin kept none)
    for _ in range(2):
        ks.k[(4,)](x, Tensor(0x2004), out, 4001, 1, BLOCK=128)
        assert _which(fake, names) == "B"
        assert slots(fake.launches[-1]) == [0x1000, 0x2004, 0x3000, 4001, 1, 0, 0]
    ks.k[(4,)](Tensor(0x1004), y, out, 4096, 2, BLOCK=128)  # x unaligned: only C holds
    assert _which(fake, names) == "C"
    ks.k[(4,)](x, y, out, 4096, 1, BLOCK=128)
    assert _which(fake, names) == "A"


def test_a_none_argument_takes_the_variant_compiled_with_it_none(fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, names = _crate(fake, tmp_path)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    for _ in range(2):
        ks.k[(4,)](x, None, out, 4096, 1, BLOCK=128)
        assert _which(fake, names) == "D"
        assert slots(fake.launches[-1]) == [0x1000, 0x3000, 4096, 0, 0]  # y is not a parameter
        ks.k[(4,)](x, y, out, 4096, 1, BLOCK=128)  # alternating: each its own
        assert _which(fake, names) == "A"
    with pytest.raises(TritonMissingVariantError, match=r"x=None"):
        ks.k[(4,)](None, y, out, 4096, 1, BLOCK=128)


def test_an_int_of_2_31_or_more_takes_an_i64_variant_else_a_named_error(fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, names = _crate(fake, tmp_path)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    big = (1 << 31) + 16
    for _ in range(2):
        ks.k[(4,)](x, y, out, big, 1, BLOCK=128)
        assert _which(fake, names) == "E"
        assert slots(fake.launches[-1])[3] == big
        ks.k[(4,)](x, y, out, 4096, 1, BLOCK=128)  # back in i32 range: the i32 variant, as the JIT
        assert _which(fake, names) == "A"
    h = [Tensor(0x1000, "float16") for _ in range(3)]
    with pytest.raises(TritonMissingVariantError, match=r"n: i64:16.*\n.*nearest built variants:\n.*\bk__v"):
        ks.k[(4,)](*h, big, 1, BLOCK=128)


def test_another_dtype_takes_its_own_variant_and_back(fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, names = _crate(fake, tmp_path)
    f32 = [Tensor(0x1000 * (i + 1)) for i in range(3)]
    f16 = [Tensor(0x1000 * (i + 1), "float16") for i in range(3)]
    for _ in range(3):
        ks.k[(4,)](*f32, 4096, 1, BLOCK=128)
        assert _which(fake, names) == "A"
        ks.k[(4,)](*f16, 4096, 1, BLOCK=128)
        assert _which(fake, names) == "F"
    bf16 = [Tensor(0x1000 * (i + 1), "bfloat16") for i in range(3)]
    with pytest.raises(TritonMissingVariantError, match=r"x: \*bf16:16.*\n(.*\n)*.*args = \{ x = \"\*bf16:16\""):
        ks.k[(4,)](*bf16, 4096, 1, BLOCK=128)


def test_an_int_address_for_a_pointer_is_taken_as_the_pointer_variants_take_it(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, names = _crate(fake, tmp_path)
    ks.k[(4,)](0x1000, 0x2000, 0x3000, 4096, 1, BLOCK=128)
    assert _which(fake, names) == "A" and slots(fake.launches[-1])[:3] == [0x1000, 0x2000, 0x3000]


def test_do_not_specialize_takes_the_variant_without_the_assumption_the_jit_does_not_make(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    """``n`` under ``do_not_specialize``: the JIT compiles it ``i32`` whatever its value, so with
    n = 4096 the variant without ``:16`` is the exact one (a variant assuming it would hold too);
    ``do_not_specialize_on_alignment`` keeps ``== 1``."""
    p = [param("x"), param("n", do_not_specialize=True), param("s", do_not_specialize_on_alignment=True),
         param("B", constexpr=True)]
    es = {"div": variant("d", p, {"x": "*fp32:16", "n": "i32:16", "s": "i32:16"}, {"B": 4}),
          "plain": variant("d", p, {"x": "*fp32:16", "n": "i32", "s": "i32"}, {"B": 4}),
          "one": variant("d", p, {"x": "*fp32:16", "n": "i32", "s": "i32:1"}, {"B": 4})}
    ks = load_crate(fake, tmp_path, list(es.values()))
    names = {e.name: k for k, e in es.items()}
    x = Tensor(0x1000)
    ks.d[(1,)](x, 4096, 32, B=4)
    assert _which(fake, names) == "plain"
    ks.d[(1,)](x, 4096, 1, B=4)
    assert _which(fake, names) == "one"
