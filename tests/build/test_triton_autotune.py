"""Triton crates whose kernels are written as real-world Triton code is (issue #30): under
``@triton.autotune`` and ``@triton.heuristics``. On the CPU: the instance options, one real build
of tests/packages/triton_kernels_pkg/kernels/autotuned (sm_90 only), the build errors for what the
runtime cannot do without Triton, and the runtime's choice of a config on the fake driver (its
event timer standing in for the GPU's): timed once per key, cached, refused during a capture,
the author's rule, the pin, and repeated calls on the memo path."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.model import PrintReporter
from hatch_khal.triton.instances import parse_instances
from khal_runtime.errors import CaptureError, TritonAutotuneError
from khal_runtime.manifest import TritonFacts
from khal_runtime.triton import TUNE_LAUNCHES, TUNE_ROUNDS, TritonKernel

from tests.helpers.fakecuda import FakeDriver, fake, ptx_param_layouts  # noqa: F401
from tests.helpers.paths import PACKAGES

SOURCE = PACKAGES / "triton_kernels_pkg" / "kernels" / "autotuned" / "autotuned.py"
ADD_SIG = {"x_ptr": "*fp32:16", "y_ptr": "*fp32:16", "out_ptr": "*fp32:16", "n_elements": "i32:16", "alpha": "fp32"}
INSTANCES: list[dict[str, Any]] = [
    # one variant per config (and each one's conservative twin), timed at first use per n_elements
    {"kernel": "scaled_add", "signature": ADD_SIG, "autotune": True},
    # the same kernel without autotune: the instance gives the constexpr itself, as for a plain @triton.jit
    {"kernel": "scaled_add", "name": "scaled_add_plain", "signature": {**ADD_SIG, "BLOCK_SIZE": 256},
     "num_warps": 2},
    # a heuristic's constexpr given by the instance
    {"kernel": "copy_even", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32",
                                          "EVEN": False}, "autotune": True},
    # reset_to_zero: sound with the author's rule (nothing is timed on the caller's buffers)
    {"kernel": "accumulate", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"},
     "autotune": True, "choose": 1},
]


def _project(root: Path) -> Path:
    (root / "k").mkdir(parents=True)
    (root / "pkg").mkdir()
    shutil.copy(SOURCE, root / "k" / "autotuned.py")
    return root


def _build(root: Path, instances: list[dict[str, Any]], cache: Path) -> Any:
    from hatch_khal.builder import build_packages, write_package_output

    _, crates = parse_config({"archs": ["sm_90"], "ptx-arch": "none", "crates": [
        {"name": "tuned", "sources": ["k/*.py"], "instances": instances}]}, default_package="pkg")
    result = build_packages(root, crates, PrintReporter(), cache=Cache(cache, print), jobs=1)
    for out in result.packages:
        write_package_output(out, root / out.package)
    return result


# -- instances (no Triton) ------------------------------------------------------------------------

def test_autotune_and_choose_are_instance_options_and_an_instance_without_them_records_as_before() -> None:
    plain, = parse_instances("k", [{"kernel": "k", "signature": {"x": "*fp32", "B": 64}}])
    assert not plain.autotune and plain.choose is None
    assert set(plain.record()) == {"kernel", "signature", "constexprs", "divisible", "ones", "num_warps",
                                   "num_stages"}
    tuned, base = parse_instances("k", [{"kernel": "k", "signature": {"x": "*fp32:16"}, "autotune": True,
                                         "choose": "first"}])
    assert tuned.autotune and base.autotune and tuned.choose == base.choose == 0
    assert tuned.record()["autotune"] is True and tuned.record()["choose"] == 0
    timed, = parse_instances("k", [{"kernel": "k", "signature": {"x": "*fp32"}, "autotune": True, "choose": "time"}])
    assert timed.choose is None


@pytest.mark.parametrize(("table", "match"), [
    ({"autotune": "yes"}, r"instances\[0\] \(k\): option 'autotune' must be true or false"),
    ({"choose": 1}, r"option 'choose' picks one of the kernel's @triton.autotune configs: it needs autotune = true"),
    ({"autotune": True, "choose": "fastest"}, r"option 'choose' is 'fastest', not \"time\""),
    ({"autotune": True, "choose": -1}, r"option 'choose' is -1"),
])
def test_a_bad_autotune_option_is_a_config_error(table: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_instances("c", [{"kernel": "k", "signature": {"x": "*fp32"}, **table}])


def test_the_autotune_facts_are_hashed_only_when_set() -> None:
    common: dict[str, Any] = {"kernel": "k", "family": "k", "num_warps": 4, "num_stages": 3, "shared": 0,
                              "names": ("x", "n"), "types": ("*fp32", "i32"), "cache_key": "c",
                              "triton_version": "3.6.0"}
    old = TritonFacts(**common)
    assert not {"config", "autotune_key", "choose"} & set(old.record())  # an older manifest's entry hash holds
    new = TritonFacts(**common, config=1, autotune_key=("n",))
    assert new.record()["config"] == 1 and new.record()["autotune_key"] == ["n"] and "choose" not in new.record()
    assert TritonFacts(**common, config=1, choose=0).record()["choose"] == 0
    with pytest.raises(ValueError, match="autotune key or rule without a config"):
        TritonFacts(**common, autotune_key=("n",))


# -- one real build --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = _project(tmp_path_factory.mktemp("tuned") / "p")
    return root, _build(root, INSTANCES, tmp_path_factory.mktemp("cache"))


def _entries(root: Path) -> dict[str, Any]:
    m = json.loads((root / "pkg" / "_khal" / "manifest.json").read_text())
    return {e["name"]: e for e in m["crates"][0]["entries"]}


@pytest.mark.needs_triton
def test_an_autotuned_kernel_builds_one_variant_per_config_in_one_family(built: tuple[Path, Any]) -> None:
    root, _ = built
    es = _entries(root)
    tuned = {n: e for n, e in es.items() if e["triton"]["family"] == "scaled_add"}
    assert sorted(tuned) == ["scaled_add__base__c0", "scaled_add__base__c1", "scaled_add__c0", "scaled_add__c1"]
    for name, e in tuned.items():
        t = e["triton"]
        config = int(name[-1])
        assert t["config"] == config and t["autotune_key"] == ["n_elements"] and "choose" not in t
        assert t["constexprs"] == {"BLOCK_SIZE": (128, 1024)[config]}  # the config's kwargs
        assert (t["num_warps"], t["num_stages"]) == ((4, 3), (8, 2))[config]
        assert e["block_size"] == [t["num_warps"] * 32, 1, 1]
        assert t["base"] == ("__base" in name) and t["divisible"] == ([] if t["base"] else
                                                                      ["x_ptr", "y_ptr", "out_ptr", "n_elements"])
        assert e["symbol"].startswith(f"{name}_khal_")
    assert len({e["hash"] for e in tuned.values()}) == 4
    # the same kernel, the instance giving its constexpr: built as a plain @triton.jit kernel (this failed with
    # "names 'scaled_add', a @triton.jit function that none of the crate's sources define")
    plain = es["scaled_add_plain"]["triton"]
    assert plain["constexprs"] == {"BLOCK_SIZE": 256} and plain["num_warps"] == 2 and "config" not in plain
    assert plain["cache_key"] == tuned["scaled_add__c0"]["triton"]["cache_key"]  # the same source hashed
    assert es["copy_even__c1"]["triton"]["constexprs"] == {"BLOCK_SIZE": 512, "EVEN": False}
    assert es["accumulate__c0"]["triton"]["choose"] == 1


@pytest.mark.needs_triton
def test_the_stub_names_the_autotuned_family_once(built: tuple[Path, Any]) -> None:
    root, _ = built
    stub = (root / "pkg" / "_khal" / "__init__.pyi").read_text()
    # as many attributes as a plain family (the crate's and the package's), none per config
    assert stub.count("    scaled_add: TritonKernel") == stub.count("    scaled_add_plain: TritonKernel") > 0
    assert "scaled_add__c0: " not in stub and "scaled_add__base__c0: " not in stub
    assert "chosen per value of (n_elements) by timing on first use" in stub
    assert "by the crate's rule: config 1" in stub


@pytest.mark.needs_triton
@pytest.mark.parametrize(("instance", "match"), [
    ({"kernel": "copy_even", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"},
      "autotune": True},
     r"instance 'copy_even': kernel 'copy_even' computes EVEN from its arguments at each call "
     r"\(@triton.heuristics\).*give each a value in the instance's signature \(EVEN = \.\.\.\)"),
    ({"kernel": "accumulate", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"},
      "autotune": True},
     r"instance 'accumulate': kernel 'accumulate'\'s @triton.autotune has reset_to_zero=\['out_ptr'\].*give a "
     r"rule instead: choose = N"),
    ({"kernel": "hooked", "signature": {"x_ptr": "*fp32", "n_elements": "i32"}, "autotune": True, "choose": 0},
     r"instance 'hooked': config 0 of kernel 'hooked'\'s @triton.autotune .* has a pre_hook"),
    ({"kernel": "scaled_add", "signature": {k: v for k, v in ADD_SIG.items()}},
     r"kernel 'scaled_add' is @triton.autotune'd: give its configs' constexprs \(BLOCK_SIZE\) in the signature, "
     r"or set autotune = true"),
    ({"kernel": "scaled_add", "signature": {**ADD_SIG, "BLOCK_SIZE": 64}, "autotune": True},
     r"sets BLOCK_SIZE, which the instance's signature gives too"),
    ({"kernel": "accumulate", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"},
      "autotune": True, "choose": 2},
     r"option 'choose' is 2, but kernel 'accumulate'\'s @triton.autotune has 2 config\(s\)"),
])
def test_what_the_runtime_cannot_do_without_triton_is_refused_at_build_saying_what_to_write(
        tmp_path: Path, instance: dict[str, Any], match: str) -> None:
    root = _project(tmp_path / "p")
    with pytest.raises(ConfigError, match=match):
        _build(root, [instance], tmp_path / "c")


# -- the runtime, on the fake driver ---------------------------------------------------------------

def _load(root: Path, drv: FakeDriver) -> Any:
    import khal_runtime

    pkg = root / "pkg"
    for ptx in (pkg / "_khal").rglob("*.ptx"):
        drv.layouts.update({f"FUNC:{n}": lay for n, lay in ptx_param_layouts(ptx.read_bytes()).items()})
    return khal_runtime.load(pkg)


def _symbol(ks: Any, name: str) -> str:
    return f"FUNC:{ks.crates['tuned'].instances[name].entry.symbol}"


def _grid(n: int) -> Any:
    return lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)


@pytest.mark.needs_triton
def test_the_first_call_per_key_times_every_config_and_later_calls_reuse_the_choice(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer

    ks = _load(built[0], fake)
    k = ks.scaled_add
    assert isinstance(k, TritonKernel) and k.tuned and sorted(k.configs) == [0, 1]
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    # config 1 is faster for n=4096 (each event pair: config 0, then config 1, per round)
    fake.elapsed = itertools.cycle([2.0, 1.0])
    k[_grid(4096)](x, y, out, 4096, 2.0)
    per_config = 1 + TUNE_ROUNDS * TUNE_LAUNCHES
    timed = fake.launches[:-1]
    assert len(timed) == 2 * per_config
    assert {la["f"] for la in timed} == {_symbol(ks, "scaled_add__c0"), _symbol(ks, "scaled_add__c1")}
    assert fake.names().count("cuEventRecord") == 2 * 2 * TUNE_ROUNDS
    last = fake.launches[-1]
    # the chosen config's variant, its block and the grid its own BLOCK_SIZE gives
    assert last["f"] == _symbol(ks, "scaled_add__c1") and last["block"] == (256, 1, 1) and last["grid"] == (4, 1, 1)
    assert k.choices == {(4096,): 1} and k.chosen(x, y, out, 4096, 2.0) == "scaled_add__c1"
    # the same key: no timing, whatever the alignment (the conservative twin of the same config)
    before = len(fake.launches)
    k[_grid(4096)](x, y, out, 4096, 3.0)
    k[_grid(4096)](x.ptr + 4, y, out, 4096, 3.0)
    assert len(fake.launches) == before + 2 and fake.launches[-1]["f"] == _symbol(ks, "scaled_add__base__c1")
    # another key: timed again (config 0 faster this time), and each key keeps its own choice
    fake.elapsed = itertools.cycle([1.0, 3.0])
    k[_grid(2048)](x, y, out, 2048, 2.0)
    assert len(fake.launches) == before + 2 + 2 * per_config + 1
    assert fake.launches[-1]["f"] == _symbol(ks, "scaled_add__c0") and fake.launches[-1]["grid"] == (16, 1, 1)
    assert k.choices == {(4096,): 1, (2048,): 0}
    k[_grid(4096)](x, y, out, 4096, 2.0)
    assert fake.launches[-1]["f"] == _symbol(ks, "scaled_add__c1")


@pytest.mark.needs_triton
def test_repeated_calls_stay_on_the_memo_path_after_the_choice(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.kernels import Kernel

    ks = _load(built[0], fake)
    k = ks.scaled_add
    slow: list[str] = []
    generic = Kernel.launch

    def counted(self: Any, *a: Any, **kw: Any) -> None:
        slow.append(self.name)
        generic(self, *a, **kw)

    monkeypatch.setattr(Kernel, "launch", counted)
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    fake.elapsed = itertools.cycle([2.0, 1.0])
    k[(4,)](x, y, out, 4096, 2.0)
    n = len(slow)
    assert n == 2 * (1 + TUNE_ROUNDS * TUNE_LAUNCHES) + 1  # the timing and the launch, through the checked path
    for _ in range(3):
        k[(4,)](x, y, out, 4096, 2.0)  # the memo's repeat
        k[(4,)](x, y, out, 4096, 0.5)  # a new value, the same key: the generated full read
    assert len(slow) == n and fake.launches[-1]["f"] == _symbol(ks, "scaled_add__c1")
    assert "c = chosen.get((bits, v3))" in k.source and "g = g(cx)" in k.source


@pytest.mark.needs_triton
def test_a_capture_never_times_it_uses_the_cached_choice_or_says_to_run_once_before(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.device import default_stream

    ks = _load(built[0], fake)
    k = ks.scaled_add
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    st = default_stream()
    with st.capture():
        with pytest.raises(CaptureError, match=r"scaled_add: autotuned, and no config is chosen yet for "
                                               r"n_elements=4096.*Call it once with these key values before "
                                               r"capturing"):
            k[(4,)](x, y, out, 4096, 2.0, stream=st)
        assert not fake.launches  # nothing timed, nothing launched
    fake.elapsed = itertools.cycle([1.0, 2.0])
    k[(4,)](x, y, out, 4096, 2.0, stream=st)  # the warm-up: timed, config 0
    records = fake.names().count("cuEventRecord")
    with st.capture():
        k[(4,)](x, y, out, 4096, 2.0, stream=st)
    assert fake.names().count("cuEventRecord") == records
    assert fake.launches[-1]["f"] == _symbol(ks, "scaled_add__c0")


@pytest.mark.needs_triton
def test_the_authors_rule_and_a_pin_choose_without_timing(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer

    x, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(2))
    ks = _load(built[0], fake)
    ks.accumulate[(16,)](x, out, 4096)  # choose = 1: no timing
    assert "cuEventRecord" not in fake.names()
    assert [la["f"] for la in fake.launches] == [_symbol(ks, "accumulate__c1")]
    k = ks.scaled_add
    with pytest.raises(TritonAutotuneError, match=r"scaled_add.bind\(\): autotuned, and no config is chosen yet for "
                                                  r"n_elements=4096: call it once"):
        k.bind(x, x, out, 4096, 1.0)
    k.pin(0)
    k[(4,)](x, x, out, 4096, 1.0)
    assert "cuEventRecord" not in fake.names() and fake.launches[-1]["f"] == _symbol(ks, "scaled_add__c0")
    assert k.bind(x, x, out, 4096, 1.0).variant.entry.name == "scaled_add__c0"
    k.pin(1)  # a remembered launch of config 0 is not reused
    k[(4,)](x, x, out, 4096, 1.0)
    assert fake.launches[-1]["f"] == _symbol(ks, "scaled_add__c1")
    with pytest.raises(TritonAutotuneError, match=r"scaled_add.pin\(5\): its configs are \[0, 1\]"):
        k.pin(5)
    with pytest.raises(TritonAutotuneError, match="not an autotuned family"):
        ks.scaled_add_plain.pin(0)
    monkeypatch.setenv("KHAL_TRITON_CONFIG", "other=3, tuned.scaled_add=1")
    assert _load(built[0], fake).scaled_add.chosen(x, x, out, 4096, 1.0) == "scaled_add__c1"
    monkeypatch.setenv("KHAL_TRITON_CONFIG", "scaled_add=7")
    with pytest.raises(TritonAutotuneError, match=r"KHAL_TRITON_CONFIG='scaled_add=7': 'scaled_add=7' does not name "
                                                  r"one of tuned.scaled_add's configs \(0, 1\)"):
        _load(built[0], fake).scaled_add  # noqa: B018


@pytest.mark.needs_triton
def test_a_config_that_cannot_launch_on_the_device_is_left_out_of_the_timing(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.errors import LaunchAttributeError

    ks = _load(built[0], fake)
    k = ks.scaled_add
    tried: list[str] = []

    def refused(*a: Any, **kw: Any) -> None:
        tried.append("c0")
        raise LaunchAttributeError("scaled_add__c0: more shared memory than the device has")

    ks.crates["tuned"].instances["scaled_add__c0"].launch = refused
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    fake.elapsed = itertools.cycle([1.0])
    k[(4,)](x, y, out, 4096, 2.0)
    assert tried == ["c0"] and k.choices == {(4096,): 1}
    assert {la["f"] for la in fake.launches} == {_symbol(ks, "scaled_add__c1")}


@pytest.mark.needs_triton
def test_inspect_shows_each_variants_config_and_how_it_is_chosen(built: tuple[Path, Any]) -> None:
    import subprocess
    import sys

    root, _ = built
    out = subprocess.run([sys.executable, "-m", "hatch_khal", "inspect", str(root / "pkg")], capture_output=True,
                         text=True, check=True).stdout
    assert re.search(r"entry scaled_add__c1 = scaled_add hash .*\n      triton scaled_add\(.*BLOCK_SIZE = 1024\)\n"
                     r"      num_warps = 8, .* autotune config 1 \(key n_elements; timed at first use\)", out), out
    assert "entry accumulate__c0 = accumulate hash" in out and "rule: config 1)" in out


@pytest.mark.needs_triton
@pytest.mark.parametrize(("field", "value"), [("autotune_key", ["alpha"]), ("config", 1), ("choose", 0)])
def test_a_manifest_whose_autotune_facts_were_edited_is_refused(built: tuple[Path, Any], tmp_path: Path,
                                                                 field: str, value: Any) -> None:
    import khal_runtime
    from khal_runtime.errors import ManifestError

    pkg = tmp_path / "pkg"
    shutil.copytree(built[0] / "pkg", pkg)
    m = json.loads((pkg / "_khal" / "manifest.json").read_text())
    e = next(e for e in m["crates"][0]["entries"] if e["name"] == "scaled_add__c0")
    e["triton"][field] = value
    (pkg / "_khal" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="entry 'scaled_add__c0'.*the manifest was edited after the build"):
        khal_runtime.load(pkg)
