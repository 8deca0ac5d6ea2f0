"""A Triton kernel's own call (``kernels.<kernel>[grid](...)``, issue #36 item 1), on the fake driver
with manifests written here: Triton's call as the JIT takes it (every parameter positional or
keyword, constexprs included, the kernel's defaults, the options, a grid callable given the meta
dict), and the named errors of a call of the wrong form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from khal_runtime.errors import ArgumentError, TritonMissingVariantError
from khal_runtime.triton_call import TritonFunction

from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401
from tests.helpers.triton_fake import Tensor, load_crate, param, slots, variant

#: add(x, y, out, n, BLOCK: tl.constexpr = 1024, ALPHA: tl.constexpr = 1.0)
P = [param("x"), param("y"), param("out"), param("n"), param("BLOCK", constexpr=True, default=1024),
     param("ALPHA", constexpr=True, default=1.0)]
ALIGNED = {"x": "*fp32:16", "y": "*fp32:16", "out": "*fp32:16", "n": "i32:16"}


def _crate(drv: FakeDriver, tmp: Path) -> tuple[Any, dict[str, Any]]:
    es = {"default": variant("add", P, ALIGNED, {"BLOCK": 1024, "ALPHA": 1.0}),
          "b256": variant("add", P, ALIGNED, {"BLOCK": 256, "ALPHA": 1.0}),
          "w8": variant("add", P, ALIGNED, {"BLOCK": 1024, "ALPHA": 1.0}, num_warps=8, num_stages=2),
          "half": variant("add", P, ALIGNED, {"BLOCK": 1024, "ALPHA": 0.5})}
    return load_crate(drv, tmp, list(es.values())), es


def _launched(drv: FakeDriver) -> str:
    return str(drv.launches[-1]["f"]).removeprefix("FUNC:").split("_khal_")[0]


def test_every_parameter_positional_or_keyword_constexprs_included_with_the_kernels_defaults(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, es = _crate(fake, tmp_path)
    add = ks.add
    assert isinstance(add, TritonFunction) and add.name == "add" and add.crate == "c"
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    calls = [lambda: add[(4,)](x, y, out, 4096),
             lambda: add[(4,)](x, y, out, 4096, 1024),
             lambda: add[(4,)](x, y, out, n=4096, BLOCK=1024),
             lambda: add[(4,)](x=x, y=y, out=out, n=4096),
             lambda: add[(4,)](x, y, n=4096, out=out, ALPHA=1.0),
             lambda: add.run(x, y, out, 4096, grid=(4,))]
    for call in calls:
        call()
        assert _launched(fake) == es["default"].name
        assert slots(fake.launches[-1]) == [0x1000, 0x2000, 0x3000, 4096, 0, 0]
        assert fake.launches[-1]["grid"] == (4, 1, 1) and fake.launches[-1]["block"] == (128, 1, 1)
    add[(4,)](x, y, out, 4096, BLOCK=256)
    assert _launched(fake) == es["b256"].name
    add[(4,)](x, y, out, 4096, 256)  # the constexpr positionally
    assert _launched(fake) == es["b256"].name
    add[(4,)](x, y, out, 4096, ALPHA=0.5)
    assert _launched(fake) == es["half"].name
    add[(4,)](x, y, out, 4096)  # and back: each shape takes its own variant
    assert _launched(fake) == es["default"].name


def test_the_options_select_the_variant_compiled_with_them(fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, es = _crate(fake, tmp_path)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    ks.add[(4,)](x, y, out, 4096, num_warps=8, num_stages=2)
    assert _launched(fake) == es["w8"].name and fake.launches[-1]["block"] == (256, 1, 1)
    ks.add[(4,)](x, y, out, 4096, num_warps=4, num_stages=3)  # Triton's defaults, given
    assert _launched(fake) == es["default"].name
    with pytest.raises(TritonMissingVariantError, match=r"differs in num_warps"):
        ks.add[(4,)](x, y, out, 4096, num_warps=8)  # num_stages stays 3: not built
    with pytest.raises(ArgumentError, match=r"num_warps=0 is not a positive integer"):
        ks.add[(4,)](x, y, out, 4096, num_warps=0)


def test_a_grid_callable_gets_every_argument_by_name_as_tritons_meta(fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, _ = _crate(fake, tmp_path)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    seen: list[dict[str, Any]] = []

    def grid(meta: dict[str, Any]) -> tuple[int]:
        seen.append(dict(meta))
        return (meta["n"] // meta["BLOCK"],)

    for _ in range(3):  # the first call, then its remembered shape
        ks.add[grid](x, y, out, 4096, BLOCK=256)
        assert fake.launches[-1]["grid"] == (16, 1, 1)
    assert seen[-1] == {"x": x, "y": y, "out": out, "n": 4096, "BLOCK": 256, "ALPHA": 1.0}
    assert len(seen) == 3
    ks.add[lambda m: (2, m["BLOCK"] // 512)](x, y, out, 4096)  # 2-D
    assert fake.launches[-1]["grid"] == (2, 2, 1)
    ks.add[7](x, y, out, 4096)  # an int
    assert fake.launches[-1]["grid"] == (7, 1, 1)


def test_a_call_of_the_wrong_form_is_a_typeerror_naming_the_argument_and_the_parameters(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, _ = _crate(fake, tmp_path)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    with pytest.raises(TypeError, match=r"add\[grid\]\(\): unknown keyword argument\(s\) 'BLOK'; the kernel takes x, "
                                        r"y, out, n, BLOCK \(constexpr\), ALPHA \(constexpr\); options num_warps"):
        ks.add[(4,)](x, y, out, 4096, BLOK=256)
    with pytest.raises(TypeError, match=r"^add\(\) missing 1 required positional argument: 'n'"):
        ks.add[(4,)](x, y, out)
    with pytest.raises(TypeError, match=r"^add\(\) got multiple values for argument 'x'"):
        ks.add[(4,)](x, y, out, 4096, x=x)
    with pytest.raises(TypeError, match=r"^add\(\) takes from 4 to 6 positional arguments but 7 were given"):
        ks.add[(4,)](x, y, out, 4096, 1024, 1.0, 3)
    with pytest.raises(TypeError, match=r"debug"):
        ks.add.run(x, y, out, 4096, grid=(4,), debug=True)


def test_the_kernel_is_an_attribute_of_the_crate_and_the_package_made_on_first_use(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    ks, es = _crate(fake, tmp_path)
    crate = ks.crates["c"]
    assert not crate._functions  # nothing made at load
    f = crate.add
    assert f is ks.add is crate["add"] and "add" in dir(ks) and "add" in dir(crate)
    assert crate.triton_functions() == {}  # no module recorded: not importable at run time
    with pytest.raises(AttributeError, match=r"has no entry 'sub'"):
        ks.sub  # noqa: B018
    assert f.source.startswith("def plain(_khal_grid):\n    def add(x, y, out, n, BLOCK=_khal_d4, ALPHA=_khal_d5, *,")


def test_bind_takes_the_calls_form_and_launches_the_variant_the_call_would(fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    """``k.bind(...)`` as ``k[grid](...)`` takes the arguments (keywords, constexprs, options); each
    ``b(grid)`` launches the variant the call would, a callable grid given the meta dict."""
    ks, es = _crate(fake, tmp_path)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    b = ks.add.bind(x, y, out, n=4096, BLOCK=256)
    n0 = len(fake.launches)
    b((4,))
    b(4)
    b(lambda meta: (meta["n"] // meta["BLOCK"],))
    assert _launched(fake) == es["b256"].name
    assert [launch["grid"] for launch in fake.launches[n0:]] == [(4, 1, 1), (4, 1, 1), (16, 1, 1)]
    assert slots(fake.launches[-1]) == [0x1000, 0x2000, 0x3000, 4096, 0, 0]
    ks.add.bind(x, y, out, 4096, num_warps=8, num_stages=2)((2,))
    assert _launched(fake) == es["w8"].name and fake.launches[-1]["block"] == (256, 1, 1)
    with pytest.raises(TritonMissingVariantError, match=r"differs in num_warps"):
        ks.add.bind(x, y, out, 4096, num_warps=8)
    with pytest.raises(ArgumentError, match=r"argument 'n' given twice"):
        ks.add.bind(x, y, out, 4096, n=4096)
    with pytest.raises(TypeError, match="cannot be pickled"):
        import pickle

        pickle.dumps(b)
