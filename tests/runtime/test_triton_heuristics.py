"""``@triton.heuristics`` at run time (issue #36 items 2 and 7), on the fake driver: the kernel's own
call computes them per call, from the host object it adopted or from the kernel's module, and never
launches a variant compiled with a value the call's heuristics do not compute; an instance family
of such a kernel checks them too (the ``EVEN = true`` twin defect: a call with ``n % 16 != 0``
ran the conservative twin, compiled with ``EVEN = true``, unmasked over the tail)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from khal_runtime.errors import ArgumentError, KhalError, TritonAssumptionError, TritonMissingVariantError

from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, slots, variant

#: k(x, out, n, BLOCK: tl.constexpr, EVEN: tl.constexpr) under @triton.heuristics({"EVEN": n % BLOCK == 0})
P = [param("x"), param("out"), param("n"), param("BLOCK", constexpr=True), param("EVEN", constexpr=True)]

#: the kernel's module as a library writes it, with a stand-in's objects (the attribute names the
#: run time reads of Triton's: Heuristics.values / .fn, JITFunction.fn)
MODULE = textwrap.dedent('''
    class JITFunction:
        def __init__(self, fn):
            self.fn = fn
            self.arg_names = ["x", "out", "n", "BLOCK", "EVEN"]

    class Heuristics:
        def __init__(self, fn, values):
            self.fn, self.values = fn, values
            self.arg_names = fn.arg_names

    CALLS = []

    def even(args):
        CALLS.append(dict(args))
        return args["n"] % args["BLOCK"] == 0

    def _k(x, out, n, BLOCK, EVEN):
        pass

    k = Heuristics(JITFunction(_k), {"EVEN": even})
''')


@pytest.fixture
def heur_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    name = f"khal_heur_mod_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    yield name
    sys.modules.pop(name, None)


def _which(drv: FakeDriver, names: dict[str, str]) -> str:
    return names[str(drv.launches[-1]["f"]).removeprefix("FUNC:").split("_khal_")[0]]


def test_the_kernels_call_computes_its_heuristics_each_call_and_takes_the_variant_of_their_values(
        fake: FakeDriver, tmp_path: Path, heur_module: str) -> None:  # noqa: F811
    es = {"even": variant("k", P, {"x": "*fp32:16", "out": "*fp32:16", "n": "i32:16"}, {"BLOCK": 256, "EVEN": True},
                          heuristics=("EVEN",), module=heur_module),
          "ragged": variant("k", P, {"x": "*fp32:16", "out": "*fp32:16", "n": "i32:16"},
                            {"BLOCK": 256, "EVEN": False}, heuristics=("EVEN",), module=heur_module),
          "ragged_base": variant("k", P, {"x": "*fp32", "out": "*fp32", "n": "i32"}, {"BLOCK": 256, "EVEN": False},
                                 heuristics=("EVEN",), module=heur_module)}
    ks = load_crate(fake, tmp_path, list(es.values()))
    names = {e.name: k for k, e in es.items()}
    x, out = Tensor(0x1000), Tensor(0x2000)
    mod = __import__(heur_module)
    for _ in range(2):
        ks.k[(4,)](x, out, 4096, BLOCK=256)
        assert _which(fake, names) == "even"
        ks.k[(4,)](x, out, 4000, BLOCK=256)  # divisible by 16, not by BLOCK: EVEN is False
        assert _which(fake, names) == "ragged"
        ks.k[(4,)](x, out, 4001, BLOCK=256)
        assert _which(fake, names) == "ragged_base" and slots(fake.launches[-1])[2] == 4001
    assert mod.CALLS[-1] == {"x": x, "out": out, "n": 4001, "BLOCK": 256}  # as Triton's Heuristics.run gives them
    assert len(mod.CALLS) == 6  # every call computes them
    seen: list[dict[str, Any]] = []
    ks.k[lambda meta: seen.append(meta) or (1,)](x, out, 4096, BLOCK=256)
    assert seen[-1]["EVEN"] is True  # the grid's meta holds the heuristic's value
    with pytest.raises(TritonMissingVariantError, match=r"EVEN=True"):
        ks.k[(4,)](x, out, 4096, BLOCK=128)  # EVEN True with BLOCK 128: not built


def test_an_adopted_host_gives_the_heuristics_and_a_kernel_whose_module_cannot_be_read_is_named(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    es = [variant("k", P, {"x": "*fp32:16", "out": "*fp32:16", "n": "i32:16"}, {"BLOCK": 256, "EVEN": v},
                  heuristics=("EVEN",), module="khal_no_such_module_here") for v in (True, False)]
    ks = load_crate(fake, tmp_path, es)
    x, out = Tensor(0x1000), Tensor(0x2000)
    with pytest.raises(KhalError, match=r"k: its @triton.heuristics compute EVEN at each call, from the kernel's "
                                        r"module, which cannot be read here: ModuleNotFoundError.*khal_no_such_module_here"):
        ks.k[(4,)](x, out, 4096, BLOCK=256)

    class Heuristics:  # what the serving machinery adopts: the module's original object
        values = {"EVEN": lambda a: a["n"] % a["BLOCK"] == 0}
        fn = staticmethod(lambda: None)

    ks.k.adopt_host(Heuristics())
    assert ks.k.host is not None
    ks.k[(4,)](x, out, 4096, BLOCK=256)
    assert fake.launches[-1]["f"] == f"FUNC:{es[0].symbol}"
    ks.k[(4,)](x, out, 4000, BLOCK=256)
    assert fake.launches[-1]["f"] == f"FUNC:{es[1].symbol}"

    class Wrong:  # a heuristic reading an argument the kernel does not have
        values = {"EVEN": lambda a: a["n_cols"] % 2 == 0}
        fn = staticmethod(lambda: None)

    ks.k.adopt_host(Wrong())
    with pytest.raises(ArgumentError, match=r"k\[grid\]\(\): the kernel's @triton.heuristics for EVEN read 'n_cols', "
                                            r"which the call does not give; the kernel takes x, out, n, BLOCK"):
        ks.k[(4,)](x, out, 4096, BLOCK=256)


def test_an_instance_family_refuses_a_call_its_heuristics_compute_another_value_for(
        fake: FakeDriver, tmp_path: Path, heur_module: str) -> None:  # noqa: F811
    """The guide's old advice: ``EVEN = true`` with ``n = "i32:16"``, and the conservative twin for
    the other calls. The twin is compiled with ``EVEN = true`` too: a call whose heuristic computes
    False must not run it."""
    es = [variant("k", P, {"x": "*fp32:16", "out": "*fp32:16", "n": "i32:16"}, {"BLOCK": 16, "EVEN": True},
                  name="add_even", family="add_even", heuristics=("EVEN",), module=heur_module),
          variant("k", P, {"x": "*fp32", "out": "*fp32", "n": "i32"}, {"BLOCK": 16, "EVEN": True},
                  name="add_even__base", family="add_even", heuristics=("EVEN",), module=heur_module)]
    ks = load_crate(fake, tmp_path, es)
    x, out = Tensor(0x1000), Tensor(0x2000)
    ks.add_even[(4,)](x, out, 4096)
    assert fake.launches[-1]["f"] == f"FUNC:{es[0].symbol}"
    ks.add_even[(4,)](Tensor(0x1004), out, 4096)  # the twin serves a broken alignment: EVEN still holds
    assert fake.launches[-1]["f"] == f"FUNC:{es[1].symbol}"
    n = len(fake.launches)
    for _ in range(2):  # the checked path, and the generated one
        with pytest.raises(TritonAssumptionError, match=r"add_even: the kernel's @triton.heuristics compute EVEN = "
                                                        r"False for this call, and every variant of the instance was "
                                                        r"compiled with EVEN = True"):
            ks.add_even[(4,)](x, out, 4001)
    with pytest.raises(TritonAssumptionError):
        ks.add_even.bind(x, out, 4001)
    assert len(fake.launches) == n  # nothing launched
