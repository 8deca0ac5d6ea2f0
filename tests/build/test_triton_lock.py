"""The Triton lock file (hatch_khal/triton/lock.py; notes/triton-jit.md): read, written, merged."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.errors import ConfigError
from hatch_khal.triton import lock
from hatch_khal.triton.lock import LockVariant
from khal_runtime.manifest import TritonDtype

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ADD = LockVariant(crate="tutorials", kernel="add_kernel",
                  args={"x_ptr": "*fp32:16", "y_ptr": "*fp32:16", "output_ptr": "*fp32:16", "n_elements": "i32:16"},
                  constexprs={"BLOCK_SIZE": 1024}, num_warps=4, num_stages=3)

CONTRACT_TEXT = """\
# Written by `python -m hatch_khal triton record`; merged on re-record. Each [[variant]] is one
# specialisation Triton's JIT compiled for a launch; the build compiles each for every arch.
version = 1

[[variant]]
crate = "tutorials"
kernel = "add_kernel"
args = { x_ptr = "*fp32:16", y_ptr = "*fp32:16", output_ptr = "*fp32:16", n_elements = "i32:16" }
constexprs = { BLOCK_SIZE = 1024 }
num_warps = 4
num_stages = 3
"""


def test_the_contracts_example_is_written_as_the_contract_shows_it(tmp_path: Path) -> None:
    path = tmp_path / "khal-triton.lock"
    lock.write(path, [ADD])
    assert path.read_text("utf-8") == CONTRACT_TEXT
    assert lock.read(path) == [ADD]


EVERY_KIND = LockVariant(
    crate="liger", kernel="_rms_norm_forward_kernel", module="liger_kernel.ops.rms_norm",
    args={"Y_ptr": "*bf16:16", "X_ptr": "*bf16", "stride": "i32:1", "n": "i64:16", "big": "u64", "eps": "fp32",
          "flag": "u1", "bias": "none"},
    constexprs={"BLOCK": 1024, "EVEN": True, "scale": 0.5, "tiny": 1e-05, "huge": float("inf"),
                "mode": 'say "mean"\n\tüñ\x7f', "X_dtype": TritonDtype(dtype="fp32"), "ACT": None, "neg": -3},
    num_warps=8, num_stages=2, num_ctas=2, maxnreg=128, config=3)


def test_every_kind_of_value_round_trips_and_reads_as_toml(tmp_path: Path) -> None:
    path = tmp_path / "khal-triton.lock"
    lock.write(path, [EVERY_KIND])
    text = path.read_text("utf-8")
    data = tomllib.loads(text)
    table = data["variant"][0]
    assert table["constexprs"]["X_dtype"] == {"dtype": "fp32"} and table["constexprs"]["ACT"] == {"none": True}
    assert table["num_ctas"] == 2 and table["maxnreg"] == 128 and table["config"] == 3
    (back,) = lock.read(path)
    assert back == EVERY_KIND
    assert back.constexprs["EVEN"] is True and isinstance(back.constexprs["scale"], float)
    assert back.constexprs["mode"] == 'say "mean"\n\tüñ\x7f'
    # one line per inline table, in the kernel's parameter order
    args_line = next(ln for ln in text.splitlines() if ln.startswith("args = "))
    assert args_line.index("Y_ptr") < args_line.index("X_ptr") < args_line.index("bias")


def test_options_at_their_defaults_are_left_out() -> None:
    text = lock.dumps([ADD])
    assert "num_ctas" not in text and "maxnreg" not in text and "config" not in text and "module" not in text


def test_variants_are_sorted_by_crate_kernel_module_then_the_rest_and_deduplicated(tmp_path: Path) -> None:
    b = LockVariant(crate="b", kernel="k", args={"x": "*fp32"}, num_warps=4, num_stages=3)
    a2 = LockVariant(crate="a", kernel="k", constexprs={"B": 256}, num_warps=4, num_stages=3)
    a1 = LockVariant(crate="a", kernel="k", constexprs={"B": 128}, num_warps=4, num_stages=3)
    a0 = LockVariant(crate="a", kernel="j", num_warps=8, num_stages=3)
    path = tmp_path / "k.lock"
    lock.write(path, [b, a2, a1, a0, a1, b])
    assert lock.read(path) == [a0, a1, a2, b]


def test_the_order_of_args_does_not_make_another_variant() -> None:
    other = LockVariant(crate=ADD.crate, kernel=ADD.kernel, args=dict(reversed(list(ADD.args.items()))),
                        constexprs=ADD.constexprs)
    assert other == ADD and hash(other) == hash(ADD) and other.digest() == ADD.digest()
    assert lock.merge([ADD], [other]) == [ADD]


def test_values_of_other_types_are_other_variants() -> None:
    def v(value: Any) -> LockVariant:
        return LockVariant(crate="c", kernel="k", constexprs={"X": value})

    values = [1, 1.0, True, "1", TritonDtype(dtype="fp32"), None]
    assert len({v(x).digest() for x in values}) == len(values)
    assert len(lock.merge([], [v(x) for x in values])) == len(values)


def test_merge_keeps_every_old_variant_and_adds_the_new_ones() -> None:
    old = [ADD, LockVariant(crate="tutorials", kernel="softmax_kernel", constexprs={"BLOCK_SIZE": 1024})]
    new = [ADD, LockVariant(crate="tutorials", kernel="add_kernel", args={**ADD.args, "n_elements": "i32"},
                            constexprs={"BLOCK_SIZE": 1024})]
    merged = lock.merge(old, new)
    assert len(merged) == 3 and set(old) <= set(merged) and set(new) <= set(merged)
    assert merged == sorted(merged, key=LockVariant.sort_key)


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "khal-triton.lock"
    lock.write(path, [ADD])
    before = path.read_bytes()

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        lock.write(path, [ADD, EVERY_KIND])
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["khal-triton.lock"]


def test_a_missing_file_says_how_to_record_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such lock file; record one with `python -m hatch_khal triton record"):
        lock.read(tmp_path / "khal-triton.lock")


GOOD = CONTRACT_TEXT + """
[[variant]]
crate = "tutorials"
kernel = "softmax_kernel"
args = {}
constexprs = { BLOCK_SIZE = 1024 }
num_warps = 4
num_stages = 3
"""


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("version = 1", "version = 2"), r"version 2 was written by a newer hatch-khal .* upgrade"),
    (lambda t: t.replace("version = 1\n", ""), r"'version = 1' is required at the top \(got None\)"),
    (lambda t: t.replace("version = 1", "version = 1\ncolour = 1"), r"unknown key 'colour'"),
    (lambda t: t.split("\n[[variant]]")[0] + "\nvariant = 3\n", r"'variant' must be an array of tables"),
    (lambda t: t.replace('kernel = "softmax_kernel"', 'kernel = "softmax kernel"'),
     r"variant\[1\] \(line 13\): field 'kernel': 'softmax kernel' is not a kernel's name"),
    (lambda t: t.rsplit("num_warps = 4", 1)[0] + "num_warps = 3\nnum_stages = 3\n",
     r"variant\[1\] \(line 13\) \(tutorials.softmax_kernel\): field 'num_warps': 3 is not a power of two from 1 to 32"),
    (lambda t: t.replace('crate = "tutorials"\n', "", 1),
     r"variant\[0\] \(line 5\): field 'crate' is required"),
    (lambda t: t.replace('n_elements = "i32:16"', 'n_elements = "i32:8"'),
     r"variant\[0\] .*field 'args.n_elements': ':8' in 'i32:8' is not a specialisation Triton makes"),
    (lambda t: t.replace('x_ptr = "*fp32:16"', 'x_ptr = "*fp33"'),
     r"field 'args.x_ptr': 'fp33' in '\*fp33' is not a Triton pointee type"),
    (lambda t: t.replace('x_ptr = "*fp32:16"', 'x_ptr = "*fp32:1"'),
     r"field 'args.x_ptr': ':1' in '\*fp32:1' applies to integers only"),
    (lambda t: t.replace('x_ptr = "*fp32:16"', 'x_ptr = 3'), r"field 'args.x_ptr': 3 is not a type"),
    (lambda t: t.replace("{ BLOCK_SIZE = 1024 }", "{ BLOCK_SIZE = [1024] }", 1),
     r"field 'constexprs.BLOCK_SIZE': \[1024\] is not a constexpr value"),
    (lambda t: t.replace("{ BLOCK_SIZE = 1024 }", "{ BLOCK_SIZE = { dtype = 3 } }", 1),
     r"field 'constexprs.BLOCK_SIZE': \{'dtype': 3\} is not a constexpr value"),
    (lambda t: t.replace("{ BLOCK_SIZE = 1024 }", "{ x_ptr = 1 }", 1), r"'x_ptr' is both in 'args' and in 'constexprs'"),
    (lambda t: t.replace("num_stages = 3\n", "num_stages = 3\nwarps = 4\n", 1), r"variant\[0\].*unknown field 'warps'"),
    (lambda t: t.replace("num_stages = 3\n", "num_stages = 3\nconfig = -1\n", 1),
     r"field 'config': -1 is not an integer from 0"),
    (lambda t: t.replace("num_stages = 3\n", "num_stages = 3\nmodule = \"a..b\"\n", 1),
     r"field 'module': 'a..b' is not a dotted module name"),
    (lambda t: t.replace("version = 1", "version = = 1"), r"not valid TOML"),
])
def test_a_bad_lock_file_is_refused_naming_the_file_the_variant_and_the_field(tmp_path: Path, edit: Any,
                                                                              message: str) -> None:
    path = tmp_path / "khal-triton.lock"
    path.write_text(GOOD, "utf-8")
    assert len(lock.read(path)) == 2
    path.write_text(edit(GOOD), "utf-8")
    with pytest.raises(ConfigError, match=message) as info:
        lock.read(path)
    assert str(path) in str(info.value)


def test_a_value_toml_cannot_hold_is_refused_when_written(tmp_path: Path) -> None:
    big = LockVariant(crate="c", kernel="k", constexprs={"N": 2**64})
    with pytest.raises(ConfigError, match=r"c.k: constexprs.N: 18446744073709551616 does not fit TOML's 64-bit"):
        lock.write(tmp_path / "x.lock", [big])
    assert not (tmp_path / "x.lock").exists()
