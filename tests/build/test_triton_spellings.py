"""Triton crates as written (issue #36), the build's half, on the CPU without Triton: the instance
tables' new spellings (constexprs of every kind, None arguments, ``u1``, ``maxnreg``, a matrix of
values that vary together, ``{W}`` in the options), the kernel's own ``is_constexpr`` deciding
what a signature value is (:func:`hatch_khal.triton.instances.fit`), the lock file's reader and its
entry names, and the options of companion crates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.triton import lock
from hatch_khal.triton.instances import TritonArg, fit, lock_instance, parse_instances
from khal_runtime.manifest import TritonDtype, TritonParam


def _params(*spec: str, defaults: dict[str, Any] | None = None) -> tuple[TritonParam, ...]:
    """Parameters as the worker reads them: ``"NAME:c"`` a tl.constexpr, ``"name"`` a runtime one."""
    defaults = defaults or {}
    out = []
    for s in spec:
        name, _, kind = s.partition(":")
        out.append(TritonParam(name=name, constexpr=kind == "c", default=defaults.get(name),
                               has_default=name in defaults))
    return tuple(out)


# -- instance tables -------------------------------------------------------------------------------

def test_a_matrix_of_tables_varies_values_together_and_fills_the_options() -> None:
    got = parse_instances("k", [{"kernel": "add", "name": "add_{T}", "num_warps": "{W}", "num_stages": "{S}",
                                 "signature": {"x": "*{T}:16", "n": "i32", "B": "{B}"},
                                 "matrix": [{"T": "fp32", "B": 1024, "W": 4, "S": 2},
                                            {"T": "fp16", "B": 2048, "W": 8, "S": 3}]}])
    assert [(i.name, i.num_warps, i.num_stages, i.constexprs()) for i in got] == [
        ("add_fp32", 4, 2, {"B": 1024}), ("add_fp32__base", 4, 2, {"B": 1024}),
        ("add_fp16", 8, 3, {"B": 2048}), ("add_fp16__base", 8, 3, {"B": 2048})]  # not the product: 2, not 4
    assert got[2].triton_signature()["x"] == "*fp16"
    (ctas,) = parse_instances("k", [{"kernel": "a", "signature": {"x": "*fp32"}, "num_ctas": "{C}",
                                     "maxnreg": "{R}", "matrix": {"C": [2], "R": [96]}}])
    assert ctas.num_ctas == 2 and ctas.maxnreg == 96 and ctas.record()["maxnreg"] == 96


@pytest.mark.parametrize(("table", "match"), [
    ({"matrix": []}, r"option 'matrix' as a list must hold non-empty tables"),
    ({"matrix": [{"T": ["fp32"]}]}, r"option 'matrix' as a list must hold non-empty tables of strings"),
    ({"matrix": {"T": "fp32"}}, r"option 'matrix' must be a table of non-empty lists .* or a list of tables"),
    ({"num_warps": "{W}", "matrix": [{"W": 3}]}, r"\[W=3\]: option 'num_warps' is 3, not a power of two"),
    ({"num_warps": "{W}"}, r"option 'num_warps': '\{W\}' names \{W\}, which the instance's 'matrix' does not give"),
    ({"num_warps": "{W}", "matrix": [{"W": "many"}]}, r"option 'num_warps' is 'many'"),
    ({"maxnreg": 300}, r"option 'maxnreg' is 300, not an integer from 1 to 255"),
    ({"signature": {"X": {"dtype": "float32"}}}, r"field 'X': \{ dtype = 'float32' \} is not a Triton dtype "
                                                 r"\(Triton calls it 'fp32'\)"),
    ({"signature": {"X": {"dtype": "fp32", "y": 1}}}, r"field 'X': .* is not a constexpr value: a table is"),
])
def test_a_bad_new_option_or_value_is_a_config_error_naming_instance_and_field(table: dict[str, Any],
                                                                              match: str) -> None:
    with pytest.raises(ConfigError, match=r"crate 'k': instances\[0\] \(add\)") as info:
        parse_instances("k", [{"kernel": "add", "signature": {"x": "*fp32"}, **table}])
    assert info.match(match)


def test_constexpr_values_of_every_kind_and_none_arguments_are_spelled_in_a_signature() -> None:
    (inst,) = parse_instances("k", [{"kernel": "k", "signature": {
        "x": "*fp32", "b": "none", "c": {"none": True}, "flag": "u1", "n": "i64:16", "m": "u64:16",
        "D": {"dtype": "{T}"}, "MODE": "mean", "S": {"str": "fp32"}, "F": 0.5, "E": True, "Z": {"none": True},
        "B": "{B}"}, "matrix": {"T": ["bf16"], "B": [64]}, "fallback": False}])
    # before the kernel is read, a None is a None argument; fit() makes a constexpr's None its value
    assert inst.triton_signature() == {"x": "*fp32", "b": "constexpr", "c": "constexpr", "flag": "u1", "n": "i64",
                                       "m": "u64", "D": "constexpr", "MODE": "constexpr", "S": "constexpr",
                                       "F": "constexpr", "E": "constexpr", "Z": "constexpr", "B": "constexpr"}
    params = _params("x", "b", "c", "flag", "n", "m", "D:c", "MODE:c", "S:c", "F:c", "E:c", "Z:c", "B:c")
    fitted = fit(inst, params)
    assert fitted.nones() == ["b", "c"] and [a.name for a in fitted.runtime_args] == ["x", "flag", "n", "m"]
    assert fitted.constexprs() == {"D": TritonDtype(dtype="bf16"), "MODE": "mean", "S": "fp32", "F": 0.5, "E": True,
                                   "Z": None, "B": 64}
    assert fitted.compile_constexprs()["b"] is None and fitted.divisible() == ["n", "m"]
    assert fitted.record()["nones"] == ["b", "c"] and fitted.record()["constexprs"]["D"] == {"dtype": "bf16"}


def test_the_kernels_is_constexpr_decides_and_the_old_dtype_spelling_gets_a_migration_hint() -> None:
    (inst,) = parse_instances("k", [{"kernel": "norm", "signature": {"x": "*fp32", "X_dtype": "fp32"}}])
    # earlier releases took "fp32" as a runtime fp32 argument, then Triton failed inside the kernel
    with pytest.raises(ConfigError, match=r"instance 'norm': 'X_dtype' is a tl.constexpr of kernel 'norm', and "
                                          r"'fp32' reads as a runtime argument's type .*write X_dtype = "
                                          r"\{ dtype = \"fp32\" \} for the tl.dtype, or X_dtype = \{ str = \"fp32\" \}"):
        fit(inst, _params("x", "X_dtype:c"))
    (ptr,) = parse_instances("k", [{"kernel": "norm", "signature": {"x": "*fp32", "X_dtype": "*fp32:16"},
                                    "fallback": False}])
    with pytest.raises(ConfigError, match=r"'X_dtype' is a tl.constexpr of kernel 'norm': give its value, not the "
                                          r"type '\*fp32:16'"):
        fit(ptr, _params("x", "X_dtype:c"))
    # a value for a parameter the kernel does not annotate tl.constexpr was silently compiled in
    (val,) = parse_instances("k", [{"kernel": "norm", "signature": {"x": "*fp32", "n": 1024}}])
    with pytest.raises(ConfigError, match=r"'n' is a runtime argument of kernel 'norm' .*give its type \('i32', "
                                          r"'i32:16' .*not the value 1024; to compile a value in, annotate the "
                                          r"parameter `n: tl.constexpr`"):
        fit(val, _params("x", "n"))
    assert fit(val, _params("x", "n:c")).constexprs() == {"n": 1024}


def test_an_instance_leaves_out_parameters_with_defaults_and_keeps_the_kernels_order() -> None:
    (inst,) = parse_instances("k", [{"kernel": "k", "signature": {"x": "*fp32", "OUT": {"dtype": "fp16"}}}])
    fitted = fit(inst, _params("x", "bias", "OUT:c", "MODE:c", defaults={"bias": None, "MODE": "copy"}))
    assert [a.name for a in fitted.args] == ["x", "bias", "OUT", "MODE"]
    assert fitted.nones() == ["bias"] and fitted.constexprs() == {"OUT": TritonDtype(dtype="fp16"), "MODE": "copy"}
    with pytest.raises(ConfigError, match=r"the signature names \['x', 'OUT'\], kernel 'k' takes \['x', 'n', 'OUT'\]: "
                                          r"give 'n'"):
        fit(inst, _params("x", "n", "OUT:c"))
    with pytest.raises(ConfigError, match=r"give 'eps''s type: it is a runtime argument \(its default 1e-06"):
        fit(inst, _params("x", "eps", "OUT:c", defaults={"eps": 1e-6}))
    (swapped,) = parse_instances("k", [{"kernel": "k", "signature": {"OUT": {"dtype": "fp16"}, "x": "*fp32"}}])
    with pytest.raises(ConfigError, match=r"list the arguments in the kernel's order"):
        fit(swapped, _params("x", "OUT:c"))
    with pytest.raises(ConfigError, match=r"kernel 'k' has no parameter 'OUT' \(it takes x\)"):
        fit(inst, _params("x"))


def test_an_annotated_parameter_takes_the_type_its_annotation_forces() -> None:
    (inst,) = parse_instances("k", [{"kernel": "k", "signature": {"n": "i32", "f": "u1"}}])
    annotated = (TritonParam(name="n", annotation="i64"), TritonParam(name="f", annotation="u1"))
    with pytest.raises(ConfigError, match=r"'n' is annotated 'i64' in kernel 'k'.*the signature gives 'i32'"):
        fit(inst, annotated)
    (ok, _) = parse_instances("k", [{"kernel": "k", "signature": {"n": "i64:16", "f": "i1"}}])
    assert fit(ok, annotated).triton_signature() == {"n": "i64", "f": "i1"}


def test_the_heuristics_twin_is_built_with_the_same_heuristic_value() -> None:
    # the twin drops the assumptions, never a constexpr: which is why the manifest records the
    # heuristics (the runtime refuses a call whose EVEN is not the variant's) -- the old advice
    # "EVEN = true with n = i32:16 so that the twin serves the other calls" ran unmasked code
    inst, twin = parse_instances("k", [{"kernel": "copy", "signature": {"x": "*fp32", "n": "i32:16", "EVEN": True}}])
    assert twin.base and twin.constexprs() == inst.constexprs() == {"EVEN": True} and twin.divisible() == []


# -- the lock file --------------------------------------------------------------------------------

LOCK = """\
version = 1

[[variant]]
crate = "t"
kernel = "add_kernel"
args = { x_ptr = "*fp32:16", n = "i32:16", s = "i64:1", b = "none", f = "u1" }
constexprs = { BLOCK = 1024, D = { dtype = "bf16" }, MODE = "mean", Z = { none = true }, E = 0.5, Q = false }
num_warps = 8
num_stages = 2
maxnreg = 128
config = 3
"""


def test_the_lock_file_reads_every_spelling(tmp_path: Path) -> None:
    path = tmp_path / "khal-triton.lock"
    path.write_text(LOCK)
    (v,) = lock.read(path)
    assert v == lock.LockVariant(crate="t", kernel="add_kernel", module=None,
                                 args={"x_ptr": "*fp32:16", "n": "i32:16", "s": "i64:1", "b": "none", "f": "u1"},
                                 constexprs={"BLOCK": 1024, "D": TritonDtype(dtype="bf16"), "MODE": "mean", "Z": None,
                                             "E": 0.5, "Q": False},
                                 num_warps=8, num_stages=2, num_ctas=1, maxnreg=128, config=3)
    inst = lock_instance(v, lock.entry_name(v), "L: variant[0]")
    assert inst.recorded and inst.family == inst.name and inst.config == 3 and inst.maxnreg == 128
    assert [a for a in inst.args if a.name == "s"] == [TritonArg("s", "i64", None, one=True)]


def test_a_lock_entry_is_named_by_its_content_not_its_spelling() -> None:
    a = lock.LockVariant(crate="t", kernel="_k", args={"x": "*fp32", "n": "i32"}, constexprs={"B": 64})
    b = lock.LockVariant(crate="t", kernel="_k", args={"n": "i32", "x": "*fp32"}, constexprs={"B": 64}, num_warps=4,
                         num_stages=3)
    c = lock.LockVariant(crate="t", kernel="_k", args={"x": "*fp32", "n": "i32:16"}, constexprs={"B": 64})
    assert lock.entry_name(a) == lock.entry_name(b) != lock.entry_name(c)
    assert lock.entry_name(a).startswith("_k__v") and len(lock.entry_name(a)) == len("_k__v") + 8


@pytest.mark.parametrize(("edit", "match"), [
    (("version = 1", "version = 2"), r"lock file version 2 was written by a newer hatch-khal .*reads version 1"),
    (('kernel = "add_kernel"', 'kernel = "add_kernel"\nwarps = 4'), r"variant\[0\].*: unknown field 'warps'"),
    (('n = "i32:16"', 'n = "i32:8"'), r"variant\[0\].*\(t.add_kernel\): field 'args.n': ':8' in 'i32:8' is "
                                      r"not a specialisation"),
    (('n = "i32:16"', 'n = 16'), r"field 'args.n': 16 is not a type"),
    (('D = { dtype = "bf16" }', 'D = { dtype = "bfloat16" }'), r"field 'constexprs.D': \{ dtype = 'bfloat16' \} is "
                                                               r"not a Triton dtype's name"),
    (('Z = { none = true }', 'Z = { none = false }'), r"field 'constexprs.Z': .* is not a constexpr value"),
    (("num_warps = 8", "num_warps = 6"), r"field 'num_warps': 6 is not a power of two from 1 to 32"),
    (('crate = "t"\n', ''), r"variant\[0\].*: field 'crate' is required"),
    (('BLOCK = 1024', 'x_ptr = 1024'), r"'x_ptr' is both in 'args' and in 'constexprs'"),
])
def test_a_bad_lock_file_names_the_file_the_variant_and_the_field(tmp_path: Path, edit: tuple[str, str],
                                                                 match: str) -> None:
    path = tmp_path / "khal-triton.lock"
    assert edit[0] in LOCK
    path.write_text(LOCK.replace(*edit))
    with pytest.raises(ConfigError, match=match) as info:
        lock.read(path)
    assert str(path) in str(info.value)


def test_a_lock_variant_that_no_longer_fits_its_kernel_names_the_file_the_entry_and_the_kernel() -> None:
    v = lock.LockVariant(crate="t", kernel="k", args={"x": "*fp32", "n": "i32"}, constexprs={"B": 64})
    inst = lock_instance(v, lock.entry_name(v), f"khal-triton.lock: variant[2] ({lock.entry_name(v)})")
    head = rf"khal-triton.lock: variant\[2\] \({lock.entry_name(v)}\) no longer fits kernel 'k': "
    assert [a.name for a in fit(inst, _params("x", "B:c", "n")).args] == ["x", "B", "n"]  # the kernel's order
    with pytest.raises(ConfigError, match=head + r"kernel 'k' has no parameter 'n' .*record it again"):
        fit(inst, _params("x", "B:c"))  # a parameter gone
    with pytest.raises(ConfigError, match=head + r"it gives no 'm', a parameter of the kernel"):
        fit(inst, _params("x", "n", "m", "B:c", defaults={"m": None}))  # one added (even with a default)
    with pytest.raises(ConfigError, match=head + r"'n' is a tl.constexpr of kernel 'k': give its value"):
        fit(inst, _params("x", "n:c", "B:c"))  # a runtime argument become a constexpr
    with pytest.raises(ConfigError, match=head + r"'B' is a runtime argument of kernel 'k'"):
        fit(inst, _params("x", "n", "B"))  # and the reverse


# -- configuration ---------------------------------------------------------------------------------

def test_companion_and_lock_options() -> None:
    _, (c,) = parse_config({"triton-lock": "locks/x.lock", "crates": [
        {"name": "lib", "modules": ["liger_kernel.ops.rms_norm"], "jit-fallback": True}]}, default_package="p")
    assert c.language == "triton" and c.modules == ["liger_kernel.ops.rms_norm"] and c.sources == []
    assert c.jit_fallback and c.triton_lock == "locks/x.lock" and c.triton_lock_explicit and c.language_crates == ["lib"]
    _, (d,) = parse_config({"crates": [{"name": "t", "sources": ["k/*.py"]}]}, default_package="p")
    assert d.triton_lock == "khal-triton.lock" and not d.triton_lock_explicit and not d.jit_fallback


@pytest.mark.parametrize(("raw", "match"), [
    ({"crates": [{"name": "l", "modules": ["a.b"], "sources": ["k/*.py"]}]}, r"'sources' and 'modules' are exclusive"),
    ({"crates": [{"name": "l", "modules": ["a..b"]}]}, r"'crates\[0\].modules': 'a..b' is not a dotted module name"),
    ({"crates": [{"name": "c", "sources": ["k/*.cu"], "jit-fallback": True}]}, r"option 'jit-fallback' is for Triton"),
    ({"triton-lock": "/abs/k.lock", "crates": [{"name": "t", "sources": ["k/*.py"]}]},
     r"option 'triton-lock': must be a file's path relative to the project root"),
    ({"crates": [{"name": "t"}]}, r"option 'crates\[0\].sources' is required \(or 'modules'"),
])
def test_a_bad_companion_or_lock_option_is_refused(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(raw, default_package="p")
