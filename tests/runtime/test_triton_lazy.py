"""Nothing per Triton family is generated or compiled when a package loads (issue #36 item 6: a
package of 436 families spent 6.1 s of its import compiling every family's fast call): a family's
call and a kernel's own call are generated at their first call. ``benchmarks/cpu_import_cost.py``
shows the import cost of 5 vs 500 families."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from khal_runtime import generated
from khal_runtime.triton import TritonKernel

from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, variant

P = [param("x"), param("n"), param("B", constexpr=True)]


def test_loading_generates_nothing_and_the_first_call_generates_its_family_only(
        fake: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    made: list[str] = []
    define = generated.define

    def counted(src: str, what: str, ns: dict[str, Any], fn: str) -> Any:
        made.append(what)
        return define(src, what, ns, fn)

    monkeypatch.setattr("khal_runtime.triton.define", counted)
    monkeypatch.setattr("khal_runtime.triton_call.define", counted)
    es = [variant("k", P, {"x": "*fp32:16", "n": "i32:16"}, {"B": b}, name=f"fam{b}", family=f"fam{b}")
          for b in range(1, 41)]
    ks = load_crate(fake, tmp_path, es)
    assert made == []
    assert all(isinstance(f, TritonKernel) and f._fast is None for f in ks.crates["c"])
    ks.fam7[(1,)](Tensor(0x1000), 64)
    assert made == ["triton fam7"]
    ks.fam7[(1,)](Tensor(0x1000), 64)
    assert made == ["triton fam7"]
    ks.k[(1,)](Tensor(0x1000), 64, B=9)  # the kernel's own call, and the family of its variant
    assert made == ["triton fam7", "triton kernel k", "triton k"]
