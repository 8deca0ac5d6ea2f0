"""A call no built variant covers (issue #36 item 1): ``TritonMissingVariantError`` naming the call,
the nearest built variants and what differs, the lock-file table and the record command; with the
crate's ``jit-fallback`` (``KHAL_TRITON_JIT_FALLBACK`` overrides) the call goes to Triton's JIT
object (a fake one here), said once per missing variant, the variant appended to the record file."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest

from khal_runtime.errors import TritonJitFallbackWarning, TritonMissingVariantError
from khal_runtime.manifest import TritonDtype

from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, variant

#: norm(x, w, out, n, eps, BLOCK: constexpr, DTYPE: constexpr, MODE: constexpr, HAS_W: constexpr)
P = [param("x"), param("w"), param("out"), param("n"), param("eps"), param("BLOCK", constexpr=True),
     param("DTYPE", constexpr=True), param("MODE", constexpr=True, default="mean"),
     param("HAS_W", constexpr=True, default=True)]
ARGS = {"x": "*fp32:16", "w": "*fp32:16", "out": "*fp32:16", "n": "i32:16", "eps": "fp32"}
CX = {"BLOCK": 1024, "DTYPE": TritonDtype(dtype="fp32"), "MODE": "mean", "HAS_W": True}


class FakeJIT:
    """Triton's JITFunction as the fallback sees it: ``obj[grid](**kwargs)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *a, **kw: self.calls.append((grid, kw))


FakeJIT.__module__ = "triton.runtime.jit"


def _crate(drv: FakeDriver, tmp: Path, fallback: bool = False) -> Any:
    es = [variant("norm", P, ARGS, CX), variant("norm", P, {**ARGS, "n": "i32"}, CX),
          variant("norm", P, ARGS, {**CX, "BLOCK": 2048}, num_warps=8),
          variant("norm", P, {**ARGS, "x": "*bf16:16", "out": "*bf16:16"}, {**CX, "DTYPE": TritonDtype(dtype="bf16")})]
    return load_crate(drv, tmp, es, jit_fallback=fallback)


def test_the_error_names_the_call_the_nearest_variants_and_the_lock_table_that_would_build_it(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks = _crate(fake, tmp_path)
    x, w, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    ks.norm[(4,)](x, w, out, 4096, 1e-6, BLOCK=1024, DTYPE=TritonDtype(dtype="fp32"))  # built
    with pytest.raises(TritonMissingVariantError) as got:
        ks.norm[(4,)](x, None, out, 4096, 1e-6, BLOCK=1024, DTYPE=TritonDtype(dtype="fp32"), MODE="sum",
                      HAS_W=False)
    text = str(got.value)
    assert text.startswith("c.norm: no built variant covers the call norm(x: *fp32:16, w=None, out: *fp32:16, n: "
                           "i32:16, eps: fp32, BLOCK=1024, DTYPE=tl.fp32, MODE='sum', HAS_W=False, num_warps=4, "
                           "num_stages=3).\nThe nearest built variants:\n")
    assert "differs in MODE, HAS_W, w" in text
    table = text.split("To build it, add to the project's khal-triton.lock:\n")[1].split("\nor record it")[0]
    lock = tomllib.loads("\n".join(ln.removeprefix("  ") for ln in table.splitlines()))
    assert lock == {"variant": [{"crate": "c", "kernel": "norm", "num_warps": 4, "num_stages": 3,
                                 "args": {"x": "*fp32:16", "w": "none", "out": "*fp32:16", "n": "i32:16",
                                          "eps": "fp32"},
                                 "constexprs": {"BLOCK": 1024, "DTYPE": {"dtype": "fp32"}, "MODE": "sum",
                                                "HAS_W": False}}]}
    assert "python -m hatch_khal triton record -- <your command>" in text
    assert "KHAL_TRITON_JIT_FALLBACK=1" in text
    # every assumption broken where only specialised variants of the call's key are built
    with pytest.raises(TritonMissingVariantError, match=r"but each assumes what the call breaks"):
        ks.norm[(4,)](Tensor(0x1004), w, out, 4096, 1e-6, BLOCK=1024, DTYPE=TritonDtype(dtype="fp32"))


def test_the_jit_fallback_launches_tritons_jit_says_so_once_and_records_the_variant(
        fake: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    record = tmp_path / "missing.lock"
    monkeypatch.setenv("KHAL_TRITON_RECORD", str(record))
    ks = _crate(fake, tmp_path, fallback=True)
    jit = FakeJIT()
    ks.norm.adopt_host(jit)
    x, w, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    n = len(fake.launches)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(3):
            ks.norm[(4,)](x, w, out, 4096, 1e-6, BLOCK=512, DTYPE=TritonDtype(dtype="fp32"))
        ks.norm[8](x, w, out, 4096, 1e-6, BLOCK=512, DTYPE=TritonDtype(dtype="fp32"), MODE="sum")
    assert len(fake.launches) == n  # nothing of khal's launched
    assert [str(s.message).split(":")[0] for s in said if s.category is TritonJitFallbackWarning] == ["c.norm"] * 2
    assert "Triton's JIT compiles it (recorded in" in str(said[0].message)
    assert len(jit.calls) == 4
    assert jit.calls[0] == ((4,), {"x": x, "w": w, "out": out, "n": 4096, "eps": 1e-6, "BLOCK": 512,
                                   "DTYPE": TritonDtype(dtype="fp32"), "MODE": "mean", "HAS_W": True})
    assert jit.calls[-1][0] == (8,)  # an int grid as Triton takes it
    lock = tomllib.loads(record.read_text())
    assert lock["version"] == 1
    assert [v["constexprs"]["MODE"] for v in lock["variant"]] == ["mean", "sum"]
    assert lock["variant"][0]["args"]["n"] == "i32:16" and lock["variant"][0]["constexprs"]["BLOCK"] == 512
    # a covered call still launches its variant
    ks.norm[(4,)](x, w, out, 4096, 1e-6, BLOCK=1024, DTYPE=TritonDtype(dtype="fp32"))
    assert len(fake.launches) == n + 1


def test_the_variable_overrides_the_crate_and_no_jit_is_named(
        fake: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    ks = _crate(fake, tmp_path, fallback=True)
    x, w, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    call = lambda: ks.norm[(4,)](x, w, out, 4096, 1e-6, BLOCK=512, DTYPE=TritonDtype(dtype="fp32"))  # noqa: E731
    with pytest.raises(TritonMissingVariantError, match=r"The JIT fallback is on .* but Triton or the kernel's module "
                                                        r"\(none recorded\) cannot be imported here"):
        call()  # no host adopted and no module: nothing to fall back to
    monkeypatch.setenv("KHAL_TRITON_JIT_FALLBACK", "0")
    ks.norm.adopt_host(FakeJIT())
    with pytest.raises(TritonMissingVariantError, match=r"KHAL_TRITON_JIT_FALLBACK=1"):
        call()
    monkeypatch.setenv("KHAL_TRITON_JIT_FALLBACK", "1")
    monkeypatch.setenv("KHAL_TRITON_RECORD", str(tmp_path / "r.lock"))
    with pytest.warns(TritonJitFallbackWarning):
        call()
    with pytest.raises(TritonMissingVariantError, match=r"without stream="):
        ks.norm[(4,)](x, w, out, 4096, 1e-6, BLOCK=512, DTYPE=TritonDtype(dtype="fp32"), stream=0)
