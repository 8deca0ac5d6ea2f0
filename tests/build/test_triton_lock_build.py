"""Triton crates as written (issue #36), built with Triton (sm_90 only): the lock file's variants
compiled beside the hand-written instances, the facts each entry records of its kernel (its whole
signature, None arguments, heuristics, where it is importable at run time, whether it was
recorded), and the build errors of a lock file that no longer fits its kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.model import PrintReporter
from hatch_khal.triton import lock
from khal_runtime.manifest import TritonDtype

KERNELS = '''\
import triton
import triton.language as tl


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs))
    else:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit(do_not_specialize=["n"])
def fill_kernel(out_ptr, bias_ptr, n, value, X_dtype: tl.constexpr, BLOCK: tl.constexpr = 64):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.zeros((BLOCK,), dtype=X_dtype) + value
    if bias_ptr is not None:
        x += tl.load(bias_ptr + offs, mask=offs < n).to(X_dtype)
    tl.store(out_ptr + offs, x, mask=offs < n)
'''

OTHER = '''\
import triton
import triton.language as tl


@triton.jit
def neg_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, -tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
'''

INSTANCES: list[dict[str, Any]] = [
    {"kernel": "copy_kernel", "name": "copy_even", "signature": {"x_ptr": "*fp32:16", "out_ptr": "*fp32:16",
                                                                 "n": "i32:16", "BLOCK": 64, "EVEN": True}},
    {"kernel": "fill_kernel", "name": "fill_{T}", "signature": {"out_ptr": "*{T}", "bias_ptr": "none", "n": "i32",
                                                               "value": "fp32", "X_dtype": {"dtype": "{T}"}},
     "matrix": {"T": ["fp32", "fp16"]}, "fallback": False},
]

LOCK = '''\
version = 1

[[variant]]
crate = "t"
kernel = "copy_kernel"
args = { x_ptr = "*fp32:16", out_ptr = "*fp32:16", n = "i32" }
constexprs = { BLOCK = 64, EVEN = false }
num_warps = 2
num_stages = 2

[[variant]]
crate = "t"
kernel = "fill_kernel"
args = { out_ptr = "*bf16:16", bias_ptr = "*fp32:16", n = "i64", value = "fp32" }
constexprs = { X_dtype = { dtype = "bf16" }, BLOCK = 128 }
num_warps = 4
num_stages = 3
maxnreg = 64

[[variant]]
crate = "other"
kernel = "neg_kernel"
args = { x_ptr = "*fp32:16", n = "i32:16" }
constexprs = { BLOCK = 64 }
'''


def _project(root: Path, lock_text: str = LOCK, kernels: str = KERNELS) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "kernels.py").write_text(kernels)
    (root / "other").mkdir()
    (root / "other" / "neg.py").write_text(OTHER)
    (root / "khal-triton.lock").write_text(lock_text)
    return root


def _crates(instances: list[dict[str, Any]] = INSTANCES) -> Any:
    _, crates = parse_config({"archs": ["sm_90"], "ptx-arch": "none", "crates": [
        {"name": "t", "sources": ["pkg/kernels.py"], "instances": instances},
        {"name": "other", "sources": ["other/*.py"]}]}, default_package="pkg")
    return crates


def _build(root: Path, cache: Path, instances: list[dict[str, Any]] = INSTANCES) -> Any:
    from hatch_khal.builder import build_packages, write_package_output

    result = build_packages(root, _crates(instances), PrintReporter(), cache=Cache(cache, print), jobs=1)
    for out in result.packages:
        write_package_output(out, root / out.package)
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = _project(tmp_path_factory.mktemp("lock") / "p")
    return root, _build(root, tmp_path_factory.mktemp("cache"))


def _names(root: Path) -> dict[str, str]:
    """lock entry names by (crate, kernel, constexprs' JSON)."""
    return {lock.canonical_json(v): lock.entry_name(v) for v in lock.read(root / "khal-triton.lock")}


@pytest.mark.needs_triton
def test_lock_variants_build_beside_the_instances_named_by_their_content(built: tuple[Path, Any]) -> None:
    root, result = built
    m = result.packages[0].manifest
    variants = lock.read(root / "khal-triton.lock")
    copy_v, fill_v, neg_v = (lock.entry_name(v) for v in variants)
    t = {e.name: e for e in m.crate("t").entries}
    assert list(t) == ["copy_even", "copy_even__base", "fill_fp32", "fill_fp16", copy_v, fill_v]
    assert [e.name for e in m.crate("other").entries] == [neg_v]  # a crate with no instances, only lock variants
    rec = t[copy_v].triton
    assert rec is not None and rec.recorded and rec.family == copy_v and not t["copy_even"].triton.recorded  # type: ignore[union-attr]
    assert rec.constexprs == {"BLOCK": 64, "EVEN": False} and rec.num_warps == 2 and rec.num_stages == 2
    assert t[copy_v].block_size == (64, 1, 1)
    fill = t[fill_v].triton
    assert fill is not None and fill.maxnreg == 64 and fill.types == ("*bf16", "*fp32", "i64", "fp32")
    assert fill.constexprs == {"X_dtype": TritonDtype(dtype="bf16"), "BLOCK": 128} and fill.divisible == ("out_ptr", "bias_ptr")
    # the manifest on disk reads back the same (a dtype constexpr as { "dtype": ... })
    raw = json.loads((root / "pkg" / "_khal" / "manifest.json").read_text())
    on_disk = {e["name"]: e for c in raw["crates"] for e in c["entries"]}
    assert on_disk[fill_v]["triton"]["constexprs"] == {"X_dtype": {"dtype": "bf16"}, "BLOCK": 128}
    assert on_disk[fill_v]["triton"]["recorded"] is True


@pytest.mark.needs_triton
def test_each_entry_records_its_kernels_signature_nones_heuristics_and_module(built: tuple[Path, Any]) -> None:
    _, result = built
    t = {e.name: e.triton for e in result.packages[0].manifest.crate("t").entries}
    even, twin, fill = t["copy_even"], t["copy_even__base"], t["fill_fp16"]
    assert even is not None and twin is not None and fill is not None
    # the twin drops the assumptions, not EVEN: the heuristics it carries let the runtime refuse a call
    # whose n breaks EVEN (the old guide's advice ran the unmasked body over the tail)
    assert even.heuristics == twin.heuristics == ("EVEN",) and twin.constexprs == {"BLOCK": 64, "EVEN": True}
    assert fill.heuristics == ()
    assert [(p.name, p.constexpr, p.do_not_specialize) for p in fill.params] == [
        ("out_ptr", False, False), ("bias_ptr", False, False), ("n", False, True), ("value", False, False),
        ("X_dtype", True, False), ("BLOCK", True, False)]
    assert fill.params[-1].has_default and fill.params[-1].default == 64 and not fill.params[-2].has_default
    # a None argument: compiled as constexpr None, not among the runtime arguments; the default BLOCK applied
    assert fill.nones == ("bias_ptr",) and fill.names == ("out_ptr", "n", "value")
    assert fill.constexprs == {"X_dtype": TritonDtype(dtype="fp16"), "BLOCK": 64}
    # importable at run time: the source lies in the wheel's package; a crate outside it is not
    assert (even.module, even.qualname) == ("pkg.kernels", "copy_kernel")
    (neg,) = result.packages[0].manifest.crate("other").entries
    assert neg.triton is not None and neg.triton.module is None and neg.triton.qualname is None
    assert result.packages[0].manifest.crate("t").triton is None  # nothing to say at crate level


@pytest.mark.needs_triton
def test_the_runtime_loads_the_crate(built: tuple[Path, Any]) -> None:
    import khal_runtime

    root, _ = built
    ks = khal_runtime.load(root / "pkg")  # every entry hash recomputed from the manifest: the new facts included
    assert ks.crates["t"].copy_even.entry.triton.heuristics == ("EVEN",)


@pytest.mark.needs_triton
def test_a_crates_content_hash_covers_its_own_lock_variants_only(tmp_path: Path) -> None:
    from hatch_khal.plan import plan_crates

    root = _project(tmp_path / "p")
    first = {p.cfg.name: p.content_hash for p in plan_crates(root, _crates(), PrintReporter())}
    (root / "khal-triton.lock").write_text(LOCK.replace("constexprs = { BLOCK = 64 }", "constexprs = { BLOCK = 128 }"))
    second = {p.cfg.name: p.content_hash for p in plan_crates(root, _crates(), PrintReporter())}
    assert first["t"] == second["t"] and first["other"] != second["other"]
    # the file's order and comments do not matter, only the variants
    blocks = LOCK.split("\n[[variant]]\n")
    (root / "khal-triton.lock").write_text("\n[[variant]]\n".join([blocks[0] + "# reordered", *blocks[:0:-1]]))
    third = {p.cfg.name: p.content_hash for p in plan_crates(root, _crates(), PrintReporter())}
    assert third == first


def test_a_lock_variant_of_a_crate_not_in_the_build_names_the_crates_there_are(tmp_path: Path) -> None:
    from hatch_khal.triton.language import TRITON

    root = _project(tmp_path / "p", LOCK.replace('crate = "other"', 'crate = "gone"'))
    with pytest.raises(ConfigError, match=r"khal-triton.lock: variant\[2\] \(neg_kernel\) names crate 'gone', which "
                                          r"is not a Triton crate of this build \(its Triton crates: t, other\)"):
        TRITON.plan(root, _crates()[0])
    _, (named,) = parse_config({"triton-lock": "locks/k.lock", "crates": [
        {"name": "t", "sources": ["pkg/kernels.py"]}]}, default_package="pkg")
    with pytest.raises(ConfigError, match=r"option 'triton-lock' names locks/k.lock, which is not a file of the "
                                          r"project .*record the variants first"):
        TRITON.plan(root, named)


@pytest.mark.needs_triton
@pytest.mark.parametrize(("kernels", "match"), [
    (KERNELS.replace("def copy_kernel(x_ptr, out_ptr, n,", "def copy_kernel(x_ptr, out_ptr, n, scale,"),
     r"it gives no 'scale', a parameter of the kernel"),
    (KERNELS.replace("def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr,", "def copy_kernel(x_ptr, out_ptr, "
                                                                              "BLOCK: tl.constexpr,"),
     r"kernel 'copy_kernel' has no parameter 'n'"),
    (KERNELS.replace("def copy_kernel(x_ptr, out_ptr, n,", "def copy_kernel(x_ptr, out_ptr, n: tl.constexpr,"),
     r"'n' is a tl.constexpr of kernel 'copy_kernel': give its value, not the type 'i32'"),
    (KERNELS.replace("def copy_kernel(", "def copy_kernel2("), r"a @triton.jit function of that name is defined by "
                                                              r"none of the crate's sources"),
])
def test_a_lock_variant_that_no_longer_fits_fails_the_build_naming_file_entry_and_kernel(
        tmp_path: Path, kernels: str, match: str) -> None:
    root = _project(tmp_path / "p", kernels=kernels)
    name = lock.entry_name(lock.read(root / "khal-triton.lock")[0])
    with pytest.raises(ConfigError, match=rf"khal-triton.lock: variant\[0\] \({name}\) no longer fits kernel "
                                          rf"'copy_kernel': {match}.*record it again"):
        _build(root, tmp_path / "c", [])


@pytest.mark.needs_triton
def test_the_old_dtype_spelling_of_a_constexpr_is_refused_with_the_new_one(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", "version = 1\n\n[[variant]]" + LOCK.split("[[variant]]")[3])  # crate other's
    old = [{"kernel": "fill_kernel", "signature": {"out_ptr": "*fp32", "bias_ptr": "none", "n": "i32",
                                                   "value": "fp32", "X_dtype": "fp32"}}]
    with pytest.raises(ConfigError, match=r"'X_dtype' is a tl.constexpr of kernel 'fill_kernel', and 'fp32' reads as "
                                          r"a runtime argument's type.*X_dtype = \{ dtype = \"fp32\" \}"):
        _build(root, tmp_path / "c", old)


@pytest.mark.needs_triton
def test_a_default_the_manifest_cannot_record_is_refused_by_name(tmp_path: Path) -> None:
    kernels = KERNELS.replace("BLOCK: tl.constexpr = 64):", "BLOCK: tl.constexpr = 64, SHAPE: tl.constexpr = (1, 2)):")
    root = _project(tmp_path / "p", "version = 1\n\n[[variant]]" + LOCK.split("[[variant]]")[3], kernels)
    fill = [INSTANCES[1]]
    with pytest.raises(ConfigError, match=r"kernel 'fill_kernel': the default of parameter 'SHAPE' is \(1, 2\) "
                                          r"\(tuple\), which a precompiled variant cannot record"):
        _build(root, tmp_path / "c", fill)


def test_shares_split_a_targets_instances_when_there_are_more_workers_than_targets() -> None:
    from hatch_khal.triton.language import _shares

    ts, inst = [["sm_80"], ["sm_90"]], [{"name": n} for n in "abcde"]
    assert _shares(ts, inst, 1) == [(ts, inst)]
    assert _shares(ts, inst, 2) == [([ts[0]], inst), ([ts[1]], inst)]
    split = _shares(ts, inst, 6)  # three workers per target, each instance once per target
    assert len(split) == 6 and all(len(t) == 1 for t, _ in split)
    for t in ts:
        got = sorted(i["name"] for tt, ii in split if tt == [t] for i in ii)
        assert got == list("abcde")
    assert len(_shares(ts, inst[:1], 8)) == 2  # one instance: a worker per target
    assert len(_shares([ts[0]], inst, 64)) == 5  # at most one worker per instance


def test_instances_split_among_workers_build_what_one_worker_builds(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One arch, several instances and variants, four workers: the same entries, hashes and PTX as one."""
    out = {}
    for jobs in ("1", "4"):
        monkeypatch.setenv("KHAL_JOBS", jobs)
        root = _project(tmp_path / f"j{jobs}")
        result = _build(root, tmp_path / f"cache{jobs}")
        crate = next(c for p in result.packages for c in p.manifest.crates if c.name == "t")
        ptx = (root / "pkg" / next(a.path for a in crate.artifacts if a.kind == "ptx")).read_bytes() \
            if any(a.kind == "ptx" for a in crate.artifacts) else b""
        cubin = (root / "pkg" / next(a.path for a in crate.artifacts if a.kind == "cubin")).read_bytes()
        out[jobs] = ([(e.name, e.hash) for e in crate.entries], ptx, cubin)
    assert len(out["1"][0]) >= 4 and out["1"] == out["4"]
