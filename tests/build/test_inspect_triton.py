"""``python -m hatch_khal inspect`` of Triton entries: each variant's specialisation (every
argument's type and assumption, ``:16``, ``:1``, None), every constexpr's value of every kind,
and its options (#36 item 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from khal_runtime import abi
from khal_runtime.manifest import Entry, LaunchAttributes, Param, TritonDtype, TritonFacts, TritonParam, load_manifest
from tests.helpers.fakecuda import CONTENT, write_package

_U64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}


def _entry(name: str, facts: TritonFacts) -> Entry:
    params = [Param(name=n, **_U64) if t.startswith("*") else
              Param(name=n, kind="scalar", element_type="int32", element_size=4, element_align=4)
              for n, t in zip(facts.names, facts.types) if n not in facts.ones]
    params += [Param(name="khal_global_scratch", **_U64), Param(name="khal_profile_scratch", **_U64)]
    attrs = LaunchAttributes(cluster_dims=(facts.ctas, 1, 1)) if facts.ctas > 1 else None
    sig = abi.entry_signature(name, (128, 1, 1), tuple(params), grid_dims=3, attributes=attrs, triton=facts.record())
    h = abi.entry_hash(CONTENT, sig)
    return Entry(name=name, symbol=abi.symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=tuple(params),
                 grid_dims=3, triton=facts, attributes=attrs)


def _norm(**over: object) -> TritonFacts:
    fields: dict[str, object] = dict(
        kernel="_rms_norm", family="_rms_norm__v0a1b2c3d", num_warps=8, num_stages=2, shared=1024,
        names=("Y", "X", "W", "stride", "n"), types=("*bf16", "*bf16", "*fp32", "i32", "i64"),
        divisible=("Y", "n"), ones=("stride",), nones=("B",),
        constexprs={"BLOCK": 1024, "EVEN": True, "eps": 1e-06, "mode": "mean", "X_dtype": TritonDtype(dtype="bf16"),
                    "ACT": None},
        params=tuple(TritonParam(name=n, constexpr=n.isupper() and n not in ("Y", "X", "W", "B") or n in ("eps", "mode"))
                     for n in ("Y", "X", "W", "B", "stride", "n", "eps", "mode", "BLOCK", "EVEN", "X_dtype", "ACT")),
        maxnreg=128, num_ctas=2, heuristics=("EVEN",), recorded=True, module="liger_kernel.ops.rms_norm",
        qualname="_rms_norm", cache_key="ck", triton_version="3.6.0")
    fields.update(over)
    return TritonFacts(**fields)  # type: ignore[arg-type]


def test_inspect_shows_each_triton_variants_specialisation_constexprs_and_options(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, [_entry("_rms_norm__v0a1b2c3d", _norm())], language="triton")
    out = subprocess.run([sys.executable, "-m", "hatch_khal", "inspect", str(pkg)], capture_output=True, text=True,
                         check=True).stdout
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.strip().startswith("entry _rms_norm__v0a1b2c3d = _rms_norm hash"))
    # in the kernel's order: pointers aligned or not, the JIT's `== 1`, None, a 64-bit size, then the constexprs
    assert lines[i + 1] == ('      triton _rms_norm(Y: *bf16:16, X: *bf16, W: *fp32, B: none, stride: i32:1, n: i64:16, '
                            'eps = 1e-06, mode = "mean", BLOCK = 1024, EVEN = true, X_dtype = { dtype = "bf16" }, '
                            'ACT = { none = true })')
    assert lines[i + 2] == ("      num_warps = 8, num_stages = 2, num_ctas = 2, maxnreg = 128; 1024 B shared; "
                            "heuristics EVEN; recorded (lock file); "
                            "importable as liger_kernel.ops.rms_norm:_rms_norm")


def test_an_entry_of_a_manifest_without_the_kernels_signature_shows_its_arguments_then_its_constexprs(
        tmp_path: Path) -> None:
    from hatch_khal.__main__ import _describe

    facts = TritonFacts(kernel="add_kernel", family="add_fp32", base=True, num_warps=4, num_stages=3, shared=0,
                        names=("x", "out", "n"), types=("*fp32", "*fp32", "i32"), constexprs={"BLOCK": 256},
                        cache_key="ck", triton_version="3.6.0")
    pkg = write_package(tmp_path, [_entry("add_fp32__base", facts)], language="triton")
    text = "\n".join(_describe(load_manifest(pkg / "_khal" / "manifest.json")))
    assert "      triton add_kernel(x: *fp32, out: *fp32, n: i32, BLOCK = 256)\n" \
           "      num_warps = 4, num_stages = 3; 0 B shared; the conservative twin of add_fp32" in text
