"""#38 item 9: a Slang entry whose names Slang's WGSL emitter rewrites (WGSL reserves ``__``, so runs of
underscores fold into one before the ``_<n>`` that keeps names apart: ``x_`` is ``entryPointParams_x_0``,
``_`` is ``entryPointParams_1``, member ``t__u`` is ``t_u_0``) was refused on WebGPU, on a wheel fresh
from the build, as "the manifest was edited after the build". The runtime now matches each WGSL
variable to its parameter by the binding Slang's reflection gave it, and compares names by what
survives the emitter (:func:`khal_runtime.shaders.wgsl_stem`). WGSL keywords (``loop``, ``fn``) are
harmless: every variable carries the ``entryPointParams_`` prefix."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import khal_runtime
from khal_runtime import backends
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.manifest import load_manifest
from khal_runtime.shaders import wgsl_stem
from khal_runtime.verify import verify_package
from tests.conftest import skip_without

#: buffers and scalars named as the emitter rewrites them, and WGSL keywords
BUFFERS = ("x_", "a__b", "_x", "x__", "__y", "_", "loop", "fn")
SCALARS = ("s_", "t__u", "_v", "w_2")

SOURCE = """\
struct P { float a_; float b__c; float _d; };

[shader("compute")]
[numthreads(64, 1, 1)]
void renamed(uint3 t : SV_DispatchThreadID, uniform ConstantBuffer<P> p_,
             BUFFERS, SCALARS)
{
    uint n, s;
    x_.GetDimensions(n, s);
    if (t.x >= n) return;
    float base = p_.a_ + 10.0 * p_.b__c + 100.0 * p_._d + 1000.0 * s_ + 2000.0 * t__u + 3000.0 * _v + 4000.0 * float(w_2);
BODY
}
"""


def _source() -> str:
    bufs = ",\n             ".join(f"uniform RWStructuredBuffer<float> {b}" for b in BUFFERS)
    scal = ", ".join(f"uniform {'int' if s == 'w_2' else 'float'} {s}" for s in SCALARS)
    body = "\n".join(f"    {b}[t.x] = base + {i}.0;" for i, b in enumerate(BUFFERS))
    return SOURCE.replace("BUFFERS", bufs).replace("SCALARS", scal).replace("BODY", body)


@pytest.fixture(scope="module")
def pkg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The crate built as the hook builds it (sm_90, no PTX, WGSL and SPIR-V) into a package."""
    if importlib.util.find_spec("slangpy") is None:
        pytest.skip("slangpy (the Slang compiler) is not installed")
    skip_without("needs_nvrtc")  # the crate's CUDA unit compiles with NVRTC
    from hatch_khal.builder import build_packages
    from hatch_khal.cache import Cache
    from hatch_khal.config import parse_config

    from tests.helpers.build import Recorder

    root = tmp_path_factory.mktemp("wgsl-names") / "proj"
    (root / "k").mkdir(parents=True)
    (root / "k" / "renamed.slang").write_text(_source())
    (root / "names_pkg").mkdir()
    (root / "names_pkg" / "__init__.py").write_text("")
    _, crates = parse_config({"archs": ["sm_90"], "ptx-arch": "none",
                              "crates": [{"name": "names", "sources": ["k/*.slang"]}]}, default_package="names_pkg")
    rep = Recorder()
    (pkg,) = build_packages(root, crates, rep, cache=Cache(tmp_path_factory.mktemp("cache"), rep.warn)).packages
    out = root / "names_pkg"
    for rel, data in pkg.files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return out


def test_the_emitter_renames_these_names(pkg_dir: Path) -> None:
    """The premise, from the built WGSL: the names are not the parameters' spellings."""
    m = load_manifest(pkg_dir / "_khal" / "manifest.json")
    (target,) = [t for t in m.crates[0].entries[0].webgpu or () if t.target == "wgsl"]
    wgsl = (pkg_dir / target.path).read_text()
    assert "entryPointParams_x__0" not in wgsl and "entryPointParams_x_0" in wgsl
    assert "t_u_0" in wgsl and "t__u" not in wgsl
    assert {b.param for b in target.bindings} >= set(BUFFERS)


def test_a_fresh_build_verifies(pkg_dir: Path) -> None:
    """verify (what a WebGPU load runs) finds nothing wrong with a package fresh from the build; it
    reported each renamed binding as "the manifest was edited after the build"."""
    problems = verify_package(pkg_dir)
    assert problems == [], [p.message for p in problems]


def test_an_edited_binding_is_still_caught(pkg_dir: Path, tmp_path: Path) -> None:
    """Matching by binding does not let a manifest edit through: two bindings swapped are refused."""
    import shutil

    pkg = tmp_path / "names_pkg"
    shutil.copytree(pkg_dir, pkg)
    path = pkg / "_khal" / "manifest.json"
    m = load_manifest(path)
    c = m.crates[0]
    e = c.entries[0]
    targets = []
    for t in e.webgpu or ():
        if t.target == "wgsl":
            b = list(t.bindings)
            i, j = [k for k, x in enumerate(b) if x.param in ("x_", "p_")]
            b[i], b[j] = (b[i].model_copy(update={"param": b[j].param}), b[j].model_copy(update={"param": b[i].param}))
            t = t.model_copy(update={"bindings": tuple(b)})
        targets.append(t)
    e = e.model_copy(update={"webgpu": tuple(targets)})
    path.write_text(m.model_copy(update={"crates": (c.model_copy(update={"entries": (e,)}),)}).to_json())
    problems = verify_package(pkg)
    assert problems and all("edited after the build" in p.message for p in problems), [p.message for p in problems]


@pytest.mark.parametrize("name, stem", [("x_", "x"), ("a__b", "a_b"), ("_x", "x"), ("__y", "y"), ("_", ""),
                                        (None, ""), ("x_1", "x_1"), ("loop", "loop")])
def test_wgsl_stem(name: str | None, stem: str) -> None:
    assert wgsl_stem(name) == stem


@pytest.fixture
def webgpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("KHAL_BACKEND", "webgpu")
    backends.reset()
    yield
    backends.reset()


@pytest.mark.webgpu
@pytest.mark.parametrize("shader", ["wgsl", "spirv"])
def test_the_entry_runs_on_webgpu(pkg_dir: Path, webgpu: Any, monkeypatch: pytest.MonkeyPatch, shader: str) -> None:
    """The kernel launches on WebGPU (lavapipe in CI), every buffer and scalar where it belongs."""
    monkeypatch.setenv("KHAL_WEBGPU_SHADER", shader)
    if shader == "spirv":
        from khal_runtime.backends.webgpu.device import get_device

        wdev = get_device(0)
        if not wdev.has_immediates:
            pytest.skip(f"{wdev.describe()} has no 'immediates' feature (SPIR-V's loose scalars are push constants)")
    K: Any = khal_runtime.load(pkg_dir)
    n = 100
    bufs = {b: DeviceBuffer.from_numpy(np.full(n, -1, np.float32)) for b in BUFFERS}
    params = {"a_": 1.0, "b__c": 2.0, "_d": 3.0}
    scal = {"s_": 1.0, "t__u": 2.0, "_v": 3.0, "w_2": 4}
    K.renamed(n, params, *bufs.values(), *scal.values())  # in the entry's order
    base = 1.0 + 10 * 2.0 + 100 * 3.0 + 1000 * 1.0 + 2000 * 2.0 + 3000 * 3.0 + 4000 * 4
    for i, b in enumerate(BUFFERS):
        np.testing.assert_array_equal(bufs[b].to_numpy(), np.full(n, base + i, np.float32), err_msg=b)

