"""The interop registry: a library taught through the public ``register_array_type`` alone (its
arrays, its stream objects and its dtype objects) launches on the fake driver
(tests/helpers/fakecuda.py), and a library inside the package is one module."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Hashable

import pytest

import khal_runtime
from khal_runtime import interop
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, storage  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# a toy array library: its own array, dtype and stream types, none of which the runtime knows
# ---------------------------------------------------------------------------------------------
class ToyDtype:
    """Not a NumPy dtype, not a string: only the library's ``dtype_name`` hook can name it."""

    def __init__(self, code: str, size: int) -> None:
        self.code, self.size = code, size

    def __repr__(self) -> str:
        return f"toy.{self.code}"


TOY_F32 = ToyDtype("f32", 4)
TOY_I32 = ToyDtype("i32", 4)
_TOY_NAMES = {"f32": "float32", "i32": "int32"}


class ToyStream:
    """A stream object with none of the attributes the runtime reads by itself (``handle``,
    ``ptr``, ``cuda_stream``, ``__cuda_stream__``)."""

    def __init__(self, raw: int, ordinal: int) -> None:
        self._raw, self._ordinal = raw, ordinal

    def raw_handle(self) -> int:
        return self._raw


class ToyArray:
    def __init__(self, addr: int, n: int, dtype: ToyDtype, ordinal: int = 0) -> None:
        self.addr, self.n, self.dtype, self.ordinal = addr, n, dtype, ordinal


def toy_extract(a: ToyArray) -> tuple[int, int, Hashable]:
    if not a.addr:
        raise interop.BadArgument(khal_runtime.ArgumentError, "has no device memory")
    return a.addr, a.n, a.dtype


def toy_stream(obj: Any) -> tuple[int, int | None] | None:
    if not isinstance(obj, ToyStream):
        return None
    return obj.raw_handle(), obj._ordinal


def toy_dtype_name(key: Any) -> tuple[str, int] | None:
    if not isinstance(key, ToyDtype):
        return None
    return _TOY_NAMES.get(key.code, f"toy {key.code}"), key.size


@pytest.fixture(scope="module", autouse=True)
def _toy_registered() -> None:
    # the public API only (what docs/guide/interop.md shows)
    khal_runtime.register_array_type(ToyArray, toy_extract, device=lambda a: a.ordinal, memo="stable",
                                     stream=toy_stream, dtype_name=toy_dtype_name)


def _ptr(launch: dict[str, Any], slot: int) -> int:
    return int(struct.unpack("<Q", launch["slots"][slot])[0])


def test_a_registered_library_launches_with_its_arrays_streams_and_dtypes(fake: FakeDriver, tmp_path: Path) -> None:
    ks = fake_kernels(fake, tmp_path, [make_entry("copy", (storage("x"), storage("y", writable=True)))])
    x, y = ToyArray(0x10000, 64, TOY_F32), ToyArray(0x20000, 64, TOY_F32)
    for _ in range(2):  # first sight (probed, learned), then the remembered path
        ks.copy(64, x, y, stream=ToyStream(0x77, 0))
    assert len(fake.launches) == 2
    for launch in fake.launches:
        assert launch["stream"] == "CUstream(119)"  # the toy stream's raw handle, 0x77
        assert (_ptr(launch, 0), _ptr(launch, 1)) == (0x10000, 64)
        assert (_ptr(launch, 2), _ptr(launch, 3)) == (0x20000, 64)
    with pytest.raises(khal_runtime.ArgumentError, match=r"argument 'y'.*element type float32.*got int32"):
        ks.copy(64, x, ToyArray(0x30000, 64, TOY_I32), stream=ToyStream(0x77, 0))
    with pytest.raises(khal_runtime.ArgumentError, match=r"argument 'x'.*has no device memory"):
        ks.copy(64, ToyArray(0, 64, TOY_F32), y, stream=ToyStream(0x77, 0))
    with pytest.raises(khal_runtime.ArgumentValueError, match=r"argument 'x'.*is on device 1.*device 0"):
        ks.copy(64, ToyArray(0x10000, 64, TOY_F32, ordinal=1), y, stream=ToyStream(0x77, 0))
    assert len(fake.launches) == 2


def test_a_stream_object_no_library_claims_is_refused(fake: FakeDriver, tmp_path: Path) -> None:
    ks = fake_kernels(fake, tmp_path, [make_entry("copy", (storage("x"), storage("y", writable=True)))])
    x = ToyArray(0x10000, 64, TOY_F32)
    with pytest.raises(TypeError, match="stream: expected"):
        ks.copy(64, x, x, stream=object())
    assert not fake.launches



def test_a_stream_type_is_read_by_the_route_that_read_its_first_object(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    """``stream=torch.cuda.current_stream()`` is a new object on every call: after the first
    object of a type, ``as_stream`` reads the next ones with the reader that answered, without
    asking the others; a reader registered later empties what was learnt; a new object of the
    type still resolves to the same cached Stream, and another handle to another one."""
    from khal_runtime import device
    from khal_runtime.interop import registry

    asked: list[str] = []

    def other(obj: Any) -> tuple[int, int | None] | None:
        asked.append("other")
        return None

    def toy(obj: Any) -> tuple[int, int | None] | None:
        asked.append("toy")
        return toy_stream(obj)

    monkeypatch.setattr(registry, "STREAM_READERS", [other, toy])  # a library asked first, never claiming it
    monkeypatch.setattr(registry, "_STREAM_ORDER", list(registry._STREAM_ORDER))
    monkeypatch.setattr(device, "STREAM_READERS", registry.STREAM_READERS)
    registry.STREAM_TYPE_READERS.clear()
    first = device.as_stream(ToyStream(0x51, 0))
    assert asked.count("other") >= 1 and first.handle == 0x51
    asked.clear()
    again = device.as_stream(ToyStream(0x51, 0))
    assert again is first and asked == ["toy"]
    asked.clear()
    assert device.as_stream(ToyStream(0x52, 0)).handle == 0x52 and "other" not in asked
    registry._add_hooks(lambda obj: None, None)  # a library registering a reader: learn again
    assert not registry.STREAM_TYPE_READERS


#: a library module dropped into the package's interop folder, and nothing else changed
_LIBRARY_MODULE = '''
"""A toy library as an in-package module: it registers itself."""
from __future__ import annotations

from typing import Any, Hashable

from khal_runtime.interop.registry import ArrayType, add_probe


def extract(a: Any) -> tuple[int, int, Hashable]:
    return a.addr, a.n, a.dtype


def stream_handle(obj: Any) -> tuple[int, int | None] | None:
    if (type(obj).__module__ or "").startswith("toylib") and hasattr(obj, "raw"):
        return int(obj.raw), 0
    return None


def dtype_name(key: Any) -> tuple[str, int] | None:
    if (type(key).__module__ or "").startswith("toylib"):
        return {"f32": "float32"}[key.code], 4
    return None


def probe(obj: Any) -> ArrayType | None:
    if (type(obj).__module__ or "").startswith("toylib") and hasattr(obj, "addr"):
        return ArrayType("toylib.Array", extract, stream=stream_handle, dtype_name=dtype_name)
    return None


add_probe(probe, order=25, stream=stream_handle, dtype_name=dtype_name)
'''


def test_an_in_package_library_is_one_module(tmp_path: Path) -> None:
    """A copy of the runtime plus one file in ``interop/``: its arrays, streams and dtypes are
    recognised with no other file edited (and a plain import still imports no array library)."""
    shutil.copytree(ROOT / "khal_runtime", tmp_path / "khal_runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "khal_runtime" / "interop" / "toylib.py").write_text(_LIBRARY_MODULE)
    code = textwrap.dedent("""
        import sys, types
        import khal_runtime
        from khal_runtime import interop, device, dtypes
        assert khal_runtime.__file__.startswith(sys.argv[1]), khal_runtime.__file__
        Array = type("Array", (), {"__module__": "toylib"})
        Dtype = type("Dtype", (), {"__module__": "toylib", "code": "f32"})
        Stream = type("Stream", (), {"__module__": "toylib", "raw": 0x55})
        a = Array(); a.addr, a.n, a.dtype = 0x1000, 8, Dtype()
        print("TYPE", interop.array_type(a).name)
        print("EXTRACT", interop.extract(a)[:2])
        print("DTYPE", dtypes.dtype_info(a.dtype))
        print("STREAM", interop.stream_handle(Stream()))
        print("MODULES", interop.library_modules())
        print("HEAVY", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "cupy", "toylib")))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KHAL_")}
    env["PYTHONPATH"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "TYPE toylib.Array" in r.stdout
    assert "EXTRACT (4096, 8)" in r.stdout
    assert "DTYPE ('float32', 4)" in r.stdout
    assert "STREAM (85, 0)" in r.stdout
    assert "MODULES ['cai', 'cupy', 'dlpack', 'host', 'registry', 'torch', 'toylib']" in r.stdout
    assert "HEAVY []" in r.stdout


def test_the_built_in_libraries_register_in_probe_order() -> None:
    """torch before CuPy before ``__cuda_array_interface__`` (both have it), host arrays before
    DLPack (NumPy has ``__dlpack__``), sequences last."""
    from khal_runtime.interop import registry

    order = [f"{p.__module__.rsplit('.', 1)[1]}.{p.__name__}" for _, p in registry._PROBES]
    builtin = [o for o in order if o.split(".")[0] in ("torch", "cupy", "cai", "host", "dlpack")]
    assert builtin == ["torch.probe", "cupy.probe", "cai.probe", "host.probe", "dlpack.probe",
                       "host.probe_sequence"]
