"""What a Triton kernel may write, proven from the TTIR Triton compiles it to
(:mod:`hatch_khal.triton.effects`), on real IR compiled here for sm_90 as the build's worker does."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import pytest

from hatch_khal.triton.effects import written_pointers
from tests.helpers.paths import PACKAGES

pytestmark = pytest.mark.needs_triton

TUTORIALS = PACKAGES / "triton_kernels_pkg" / "kernels" / "triton" / "tutorials.py"
HOPPER = PACKAGES / "triton_kernels_pkg" / "kernels" / "hopper" / "hopper.py"
OURS = os.path.join(os.path.dirname(__file__), "triton_effects_kernels.py")


def _module(path: Any) -> Any:
    name = "_khal_effects_" + os.path.splitext(os.path.basename(str(path)))[0]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, str(path))
        assert spec is not None and spec.loader is not None
        m = importlib.util.module_from_spec(spec)
        sys.modules[name] = m
        sys.path.insert(0, os.path.dirname(str(path)))  # the crate's sources import each other
        try:
            spec.loader.exec_module(m)
        finally:
            sys.path.remove(os.path.dirname(str(path)))
    return sys.modules[name]


def _ttir(path: Any, kernel: str, sig: dict[str, str], constexprs: dict[str, Any], num_warps: int = 4) -> str:
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hatch_khal.triton.worker import compile_one

    fn = getattr(_module(path), kernel)
    full = {a: sig.get(a, "constexpr") for a in fn.arg_names}
    compiled = compile_one(triton, ASTSource, GPUTarget, fn, full, constexprs, {}, 90,
                           {"num_warps": num_warps, "num_stages": 3})
    return str(compiled.asm["ttir"])


def _written(path: Any, kernel: str, sig: dict[str, str], constexprs: dict[str, Any]) -> set[str]:
    names = list(sig)
    found = written_pointers(_ttir(path, kernel, sig, constexprs), kernel, len(names))
    assert found is not None, "the analysis could not read Triton's own IR"
    return {names[i] for i in found if sig[names[i]].startswith("*")}


ADD = {"x_ptr": "*fp32", "y_ptr": "*fp32", "output_ptr": "*fp32", "n_elements": "i32"}


def test_vector_add_reads_x_and_y_and_writes_output() -> None:
    assert _written(TUTORIALS, "add_kernel", ADD, {"BLOCK_SIZE": 1024}) == {"output_ptr"}


def test_softmax_reads_its_input_and_writes_its_output() -> None:
    sig = {"output_ptr": "*fp32", "input_ptr": "*fp32", "input_row_stride": "i32", "output_row_stride": "i32",
           "n_rows": "i32", "n_cols": "i32"}
    assert _written(TUTORIALS, "softmax_kernel", sig, {"BLOCK_SIZE": 1024}) == {"output_ptr"}


def test_matmul_whose_pointers_advance_in_a_loop_reads_a_and_b_and_writes_c() -> None:
    sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16",
           **{k: "i32" for k in "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()}}
    cx = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
    ttir = _ttir(TUTORIALS, "matmul_kernel", sig, cx)
    assert "scf.for" in ttir and "iter_args" in ttir  # the case: pointers carried through the loop
    assert _written(TUTORIALS, "matmul_kernel", sig, cx) == {"c_ptr"}


def test_a_tensor_descriptors_loaded_base_is_read_only_and_its_stored_one_written() -> None:
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32"}
    ttir = _ttir(HOPPER, "desc_add_kernel", sig, {"BLOCK_M": 32, "BLOCK_N": 32})
    assert "tt.make_tensor_descriptor" in ttir and "tt.descriptor_store" in ttir
    assert _written(HOPPER, "desc_add_kernel", sig, {"BLOCK_M": 32, "BLOCK_N": 32}) == {"out_ptr"}


def test_an_atomic_target_is_written() -> None:
    sig = {"counts_ptr": "*fp32", "x_ptr": "*fp32", "n": "i32"}
    assert _written(OURS, "atomic_kernel", sig, {"BLOCK": 128}) == {"counts_ptr"}


def test_a_pointer_passed_to_inline_asm_is_written() -> None:
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32"}
    assert _written(OURS, "asm_kernel", sig, {"BLOCK": 128}) == {"y_ptr", "out_ptr"}


def test_a_pointer_stored_as_a_value_is_written() -> None:
    sig = {"x_ptr": "*fp32", "table_ptr": "*i64"}
    assert _written(OURS, "escape_kernel", sig, {"BLOCK": 128}) == {"x_ptr", "table_ptr"}


def test_pointers_chosen_in_a_branch_and_moved_in_a_while_loop_are_written() -> None:
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
    ttir = _ttir(OURS, "branch_kernel", sig, {"BLOCK": 128})
    assert "scf.if" in ttir and "scf.while" in ttir
    assert _written(OURS, "branch_kernel", sig, {"BLOCK": 128}) == {"x_ptr", "out_ptr"}


def test_an_op_the_analysis_does_not_know_makes_its_pointers_written() -> None:
    ttir = _ttir(TUTORIALS, "add_kernel", ADD, {"BLOCK_SIZE": 1024})
    line = next(ln for ln in ttir.splitlines() if "tt.load" in ln and "%x_ptr" not in ln)
    # x's load becomes an op nobody knows (which might write through x)
    edited = ttir.replace(line, line.replace("tt.load", "tt.mystery_load"), 1)
    assert written_pointers(edited, "add_kernel", 4) == {0, 2}
    # a pointer made from an integer may point at any argument
    i2p = ttir.replace("tt.return", "%khal_p = tt.int_to_ptr %n_elements : i32 -> !tt.ptr<f32>\n"
                       "    tt.store %khal_p, %c1024_i32 : !tt.ptr<f32>\n    tt.return")
    assert written_pointers(i2p, "add_kernel", 4) == {0, 1, 2, 3}


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("tt.func public", "tt.func private"),         # no entry
    lambda t: t.replace("} loc(#loc)\n} loc(#loc)", "\n"),              # unbalanced regions
    lambda t: t.replace("%4 = arith.addi", "= arith.addi"),             # not an op
])
def test_text_the_analysis_cannot_read_proves_nothing(edit: Any) -> None:
    ttir = _ttir(TUTORIALS, "add_kernel", ADD, {"BLOCK_SIZE": 1024})
    assert written_pointers(ttir, "add_kernel", 4) == {2}
    assert written_pointers(edit(ttir), "add_kernel", 4) is None
    assert written_pointers(ttir, "add_kernel", 5) is None  # another parameter count than the caller's


def test_a_pointer_loaded_from_memory_may_point_at_any_argument() -> None:
    ttir = """module {
  tt.func public @k(%p: !tt.ptr<!tt.ptr<f32>> loc("p"), %a: !tt.ptr<f32> loc("a"), %b: !tt.ptr<f32> loc("b")) {
    %0 = tt.load %p : !tt.ptr<!tt.ptr<f32>> loc(#loc)
    %1 = tt.load %a : !tt.ptr<f32> loc(#loc)
    tt.store %0, %1 : !tt.ptr<f32> loc(#loc)
    tt.return loc(#loc)
  } loc(#loc)
} loc(#loc)
"""
    assert written_pointers(ttir, "k", 3) == {0, 1, 2}
    # the same kernel storing a loaded float through b: only b
    plain = ttir.replace("tt.store %0, %1", "tt.store %b, %1")
    assert written_pointers(plain, "k", 3) == {2}


def test_a_two_pass_kernels_weight_read_in_two_sibling_loops_is_read_only() -> None:
    """TTIR names the values of sibling regions alike (both loop bodies have a ``%9``): the first
    loop's ``%9`` (x's address) is not the second loop's (y's, stored to)."""
    sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}
    ttir = _ttir(OURS, "two_pass_kernel", sig, {"BLOCK": 128})
    assert ttir.count("scf.for") == 2 and "tt.reduce" in ttir
    assert _written(OURS, "two_pass_kernel", sig, {"BLOCK": 128}) == {"y_ptr"}


def test_reductions_write_nothing_and_their_combiners_names_are_their_own() -> None:
    """``tl.sum`` / ``tl.max`` are ``tt.reduce`` ops whose combining regions end in
    ``tt.reduce.return`` (not a store), and name their values as the loop body does (``%10``, w's
    address there)."""
    sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
    ttir = _ttir(OURS, "reduce_kernel", sig, {"BLOCK": 128})
    assert ttir.count('"tt.reduce"') == 2 and "tt.reduce.return" in ttir
    assert _written(OURS, "reduce_kernel", sig, {"BLOCK": 128}) == {"out_ptr"}


def test_an_address_through_a_reduction_is_written_only_when_stored_to() -> None:
    """A reduction of addresses (the smallest of a tensor of pointers) is an address derived from
    its operand: a load through it reads, a store through it writes."""
    ttir = """module {
  tt.func public @k(%a: !tt.ptr<f32> loc("a"), %b: !tt.ptr<f32> loc("b")) {
    %true = arith.constant true loc(#loc)
    %0 = tt.make_range {end = 4 : i32, start = 0 : i32} : tensor<4xi32> loc(#loc)
    %1 = tt.splat %a : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>> loc(#loc)
    %2 = tt.addptr %1, %0 : tensor<4x!tt.ptr<f32>>, tensor<4xi32> loc(#loc)
    %3 = "tt.reduce"(%2) <{axis = 0 : i32}> ({
    ^bb0(%arg2: !tt.ptr<f32> loc(unknown), %arg3: !tt.ptr<f32> loc(unknown)):
      %5 = arith.select %true, %arg2, %arg3 : !tt.ptr<f32> loc(#loc)
      tt.reduce.return %5 : !tt.ptr<f32> loc(#loc)
    }) : (tensor<4x!tt.ptr<f32>>) -> !tt.ptr<f32> loc(#loc)
    %4 = tt.load %3 : !tt.ptr<f32> loc(#loc)
    tt.store %b, %4 : !tt.ptr<f32> loc(#loc)
    tt.return loc(#loc)
  } loc(#loc)
} loc(#loc)
"""
    assert written_pointers(ttir, "k", 2) == {1}
    stored = ttir.replace("tt.store %b, %4", "tt.store %3, %4")
    assert written_pointers(stored, "k", 2) == {0}
    # a store inside the combiner still writes what it is given
    inner = ttir.replace("      tt.reduce.return %5", "      tt.store %arg2, %5 : !tt.ptr<f32> loc(#loc)\n"
                         "      tt.reduce.return %5")
    assert written_pointers(inner, "k", 2) == {0, 1}


def test_a_use_of_a_name_no_enclosing_region_defines_may_be_any_address() -> None:
    """A value the analysis does not see defined (an unknown region op's own arguments, printed in
    its header) is not proven anything: a store through it writes every pointer."""
    ttir = _ttir(TUTORIALS, "add_kernel", ADD, {"BLOCK_SIZE": 1024})
    assert written_pointers(ttir, "add_kernel", 4) == {2}
    edited = ttir.replace("tt.return", "tt.store %khal_unseen, %c1024_i32 : !tt.ptr<f32>\n    tt.return")
    assert written_pointers(edited, "add_kernel", 4) == {0, 1, 2, 3}
