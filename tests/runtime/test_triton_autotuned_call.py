"""An autotuned kernel's own call (issue #36 item 2: ``@triton.autotune`` keeps working, configs x
specialisations), on the fake driver (its event timer standing in for the GPU's): the config is
timed once per key among the variants of the call's specialisation and cached, a ragged call takes
the chosen config's conservative variant, the grid callable sees the config's constexprs with the
call's arguments, and options given to an autotuned kernel are refused as Triton refuses them."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from khal_runtime.errors import ArgumentError
from khal_runtime.triton import TUNE_LAUNCHES, TUNE_ROUNDS

from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, variant

#: scaled(x, out, n, alpha, BLOCK: tl.constexpr) under @triton.autotune(configs=[BLOCK 128 / 4 warps,
#: BLOCK 1024 / 8 warps], key=["n"])
P = [param("x"), param("out"), param("n"), param("alpha"), param("BLOCK", constexpr=True)]
CONFIGS = [({"BLOCK": 128}, 4), ({"BLOCK": 1024}, 8)]


def test_configs_times_specialisations_the_config_timed_once_per_key(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    es: dict[tuple[int, str], Any] = {}
    for j, (cx, nw) in enumerate(CONFIGS):
        for spec, args in (("aligned", {"x": "*fp32:16", "out": "*fp32:16", "n": "i32:16", "alpha": "fp32"}),
                           ("plain", {"x": "*fp32", "out": "*fp32", "n": "i32", "alpha": "fp32"})):
            es[(j, spec)] = variant("scaled", P, args, cx, num_warps=nw, config=j, autotune_key=("n",))
    ks = load_crate(fake, tmp_path, list(es.values()))
    names = {e.name: k for k, e in es.items()}
    x, out = Tensor(0x1000), Tensor(0x2000)
    seen: list[dict[str, Any]] = []

    def grid(meta: dict[str, Any]) -> tuple[int]:
        seen.append(dict(meta))
        return (meta["n"] // meta["BLOCK"],)

    fake.elapsed = itertools.cycle([2.0, 1.0])  # config 1 is the faster
    ks.scaled[grid](x, out, 4096, 2.0)
    timed = fake.launches[:-1]
    assert len(timed) == 2 * (1 + TUNE_ROUNDS * TUNE_LAUNCHES)
    assert {names[la["f"].removeprefix("FUNC:").split("_khal_")[0]] for la in timed} == {(0, "aligned"), (1, "aligned")}
    last = fake.launches[-1]
    assert names[last["f"].removeprefix("FUNC:").split("_khal_")[0]] == (1, "aligned")
    assert last["grid"] == (4, 1, 1) and last["block"] == (256, 1, 1)
    assert seen[-1] == {"x": x, "out": out, "n": 4096, "alpha": 2.0, "BLOCK": 1024}
    n = len(fake.launches)
    ks.scaled[grid](x, out, 4096, 3.0)  # the same key: no timing
    ks.scaled[(3,)](Tensor(0x1004), out, 4096, 3.0)  # unaligned: config 1's conservative variant
    assert len(fake.launches) == n + 2
    assert names[fake.launches[-1]["f"].removeprefix("FUNC:").split("_khal_")[0]] == (1, "plain")
    with pytest.raises(ArgumentError, match=r"num_warps given to an autotuned kernel"):
        ks.scaled[(3,)](x, out, 4096, 3.0, num_warps=4)
