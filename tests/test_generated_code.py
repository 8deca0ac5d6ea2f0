"""The generated launch code, as a newcomer meets it: tracebacks and pdb show its lines
(khal_runtime.generated), under names that never collide and entries that do not pile up; on
CPU with the fake driver (tests/fakecuda.py)."""

from __future__ import annotations

import gc
import inspect
import linecache
import re
import tempfile
import traceback
from pathlib import Path

import pytest

from khal_runtime import DeviceBuffer
from khal_runtime.device import _tls
from khal_runtime.errors import ArgumentError
from khal_runtime.manifest import ScalarSlot, WebGpuTarget
from khal_runtime.packing import ScalarPacker
from tests._runtime import FIVE, P, _kernel
from tests.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar  # noqa: F401  (fixture)


def _formatted(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def test_a_failing_launch_shows_the_generated_line(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 10, "float32", 0)
    with pytest.raises(ArgumentError) as call_err:  # the generated call
        k(10, x, x, x, P(1, 2), "bad", stream=st)
    with pytest.raises(ArgumentError) as run_err:  # the generated explicit launch
        k.launch(1, None, x, x, x, P(1, 2), "bad", stream=st)
    for err, what in ((call_err, "call"), (run_err, "launch")):
        text = _formatted(err.value)
        frame = re.search(rf'File "(<khal {what} five-\d+>)", line (\d+), in \w+\n(.*)\n', text)
        assert frame is not None, text
        name, line, shown = frame.group(1), int(frame.group(2)), frame.group(3).strip()
        assert shown == "diagnose((a0, a1, a2, a3, a4, ), exc)" if what == "call" else "diagnose(args, exc)"
        assert linecache.getline(name, line).strip() == shown
    fn = k.func
    assert inspect.getsource(fn) == k.plan(0).call_source  # what pdb's `list` reads too


def test_generated_names_are_unique_and_released(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    ks = [fake_kernels(fake, Path(tempfile.mkdtemp(prefix="khal-gen-")), [make_entry("five", FIVE)], package=p).five
          for p in ("one", "two")]
    plans = [k.plan(0) for k in ks]
    names = {k.func.__code__.co_filename for k in ks} | {p.run.__code__.co_filename for p in plans}
    assert len(names) == 4  # same entry name in two packages: four names, never one source shown for another
    before = sum(n.startswith("<khal ") for n in linecache.cache)
    for _ in range(200):  # hooks come and go: every plan regenerates
        plans[0].regenerate_code()
    gc.collect()
    after = sum(n.startswith("<khal ") for n in linecache.cache)
    assert after <= before, (before, after)
    assert ks[0].func.__code__.co_filename in linecache.cache  # the code in use keeps its lines
    assert not any(n in linecache.cache for n in names - {ks[1].func.__code__.co_filename,
                                                          plans[1].run.__code__.co_filename})


def test_the_scalar_packer_shows_its_lines() -> None:
    target = WebGpuTarget(target="spirv", path="k.spv", entry_point="k_khal_0123456789abcdef", bindings=(),
                          scalars="push_constants", scalar_block_size=8,
                          scalar_slots=(ScalarSlot(param="a", offset=0, size=4), ScalarSlot(param="b", offset=4, size=4)))
    sp = ScalarPacker("k", [scalar("a"), scalar("b", "int32")], target)
    fast = sp._fast_pack
    assert fast is not None and re.fullmatch(r"<khal scalar packer k-\d+>", fast.__code__.co_filename)
    assert inspect.getsource(fast).startswith("def pack(values):")
