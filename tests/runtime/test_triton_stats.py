"""``KHAL_TRITON_STATS=1`` (issue #36, the Liger measurement): per kernel, the launches whose variant
had exactly the JIT's specialisation, the others, and those of the JIT fallback
(``khal_runtime.triton_call.stats()``; a table on stderr at exit). Off by default: then nothing is
counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from khal_runtime import triton_call

from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, variant

P = [param("x"), param("n"), param("B", constexpr=True)]


def test_launches_are_counted_exact_or_not_when_asked(
        fake: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    es = [variant(k, P, a, {"B": 4}) for k in ("k", "off")
          for a in ({"x": "*fp32:16", "n": "i32:16"}, {"x": "*fp32", "n": "i32"})]
    ks = load_crate(fake, tmp_path, es)
    monkeypatch.setattr(triton_call, "_stats", {})
    ks.off[(1,)](Tensor(0x1000), 64, B=4)
    assert triton_call.stats() == {}  # off (the variable is read at import)
    monkeypatch.setattr(triton_call, "_STATS_ON", True)
    for _ in range(3):
        ks.k[(1,)](Tensor(0x1000), 64, B=4)  # the JIT's: x aligned, n divisible by 16
    ks.k[(1,)](Tensor(0x1000), 65, B=4)  # the JIT would keep x's alignment: not built, the plain one runs
    ks.k[(1,)](Tensor(0x1004), 65, B=4)  # nothing holds: the plain one is the JIT's
    assert triton_call.stats() == {"c.k": {"exact": 4, "other": 1, "jit": 0}}
    triton_call._print_stats()
    err = capsys.readouterr().err
    assert err.splitlines()[1:] == ["  kernel     exact     other       JIT", "  c.k            4         1         0"]
