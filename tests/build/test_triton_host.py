"""khal_runtime.triton_host against real Triton objects (installed in the test environment): the
heuristics of a kernel under ``@triton.heuristics`` (stacked, and under ``@triton.autotune``) read from
its module, outermost first, as Triton's ``Heuristics.run`` applies them; the JIT function found for
the fallback."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from khal_runtime.triton_host import Host, is_real_triton, unwrap_host

pytestmark = pytest.mark.needs_triton

MODULE = textwrap.dedent('''
    import triton
    import triton.language as tl


    @triton.heuristics({"BLOCK": lambda a: triton.next_power_of_2(a["n"]) if a["n"] < 1024 else 1024})
    @triton.heuristics({"EVEN": lambda a: a["n"] % a["BLOCK"] == 0})
    @triton.jit
    def k(x, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        pass


    @triton.autotune(configs=[triton.Config({"B": 64}), triton.Config({"B": 128}, num_warps=8)], key=["n"])
    @triton.heuristics({"ODD": lambda a: a["n"] % 2 == 1})
    @triton.jit
    def tuned(x, n, B: tl.constexpr, ODD: tl.constexpr):
        pass
''')


def test_heuristics_and_the_jit_of_real_triton_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "khal_real_heur_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        host = Host("khal_real_heur_mod", "k")
        heur = host.heuristics(("BLOCK", "EVEN"), "k")
        assert [n for n, _ in heur] == ["BLOCK", "EVEN"]  # outermost first, as Triton's Heuristics.run runs them
        a = {"x": None, "n": 100}
        for n, fn in heur:  # (each sees the values of those outside it)
            a[n] = fn(a)
        assert a["BLOCK"] == 128 and a["EVEN"] is False
        obj = host.imported()
        assert is_real_triton(obj) and host.jit() is obj
        heur2, tuner, jit = unwrap_host(sys.modules["khal_real_heur_mod"].tuned)
        assert [n for n, _ in heur2] == ["ODD"] and tuner is not None and len(tuner.configs) == 2
        assert type(jit).__name__ == "JITFunction"
    finally:
        sys.modules.pop("khal_real_heur_mod", None)
