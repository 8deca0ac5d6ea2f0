"""Importing khal_runtime and shader packages without a GPU; KHAL_BACKEND handling."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.synthetic import build_package

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, *, env_extra: dict[str, str] | None = None, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([str(path)] if path else []) + [env.get("PYTHONPATH", "")]
    )
    env["CUDA_VISIBLE_DEVICES"] = ""  # no device, even on a GPU machine
    env.pop("KHAL_BACKEND", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory):
    return build_package(tmp_path_factory.mktemp("imp"), "synth_import_pkg")


def test_import_is_cheap() -> None:
    r = _run("""
        import sys, khal_runtime
        heavy = [m for m in sys.modules if m.split('.')[0] in ('cuda', 'pydantic', 'hatch_khal', 'numpy', 'elftools')]
        heavy += [m for m in sys.modules if 'nvrtc' in m]
        print('HEAVY', heavy)
        assert not heavy, heavy
        assert callable(khal_runtime.load) and callable(khal_runtime.launch)
        assert khal_runtime.errors.BackendUnavailableError
    """)
    assert r.returncode == 0, r.stderr + r.stdout


@pytest.mark.needs_nvrtc
def test_import_shader_package_without_gpu_then_use_raises(pkg) -> None:
    r = _run(f"""
        import sys
        import {pkg.name} as p
        assert 'cuda.bindings.nvrtc' not in sys.modules
        assert not any(m.startswith('hatch_khal') for m in sys.modules)
        print(p.kernels.entries)
        from khal_runtime import BackendUnavailableError
        try:
            p.kernels.fill(16, None, 1)
        except BackendUnavailableError as e:
            print('RAISED', e)
            print('CHAINED' if e.__context__ is not None or e.__cause__ is not None else 'ONE ERROR')
        else:
            raise SystemExit('no error')
    """, path=pkg.root)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "['axpby', 'fill', 'scalars']" in r.stdout
    assert "RAISED no CUDA device/driver was found" in r.stdout
    assert "ONE ERROR" in r.stdout  # not buried under the lookups that led to it


@pytest.mark.needs_nvrtc
def test_backend_cuda_is_a_hard_error_at_load(pkg) -> None:
    r = _run(f"""
        from khal_runtime import BackendUnavailableError
        try:
            import {pkg.name}
        except BackendUnavailableError as e:
            print('RAISED', e)
        else:
            raise SystemExit('loaded without CUDA')
    """, env_extra={"KHAL_BACKEND": "cuda"}, path=pkg.root)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "RAISED package 'synth_import_pkg': KHAL_BACKEND=cuda: no CUDA device/driver was found" in r.stdout


@pytest.mark.needs_nvrtc
def test_unknown_backend_is_rejected(pkg) -> None:
    r = _run(f"""
        from khal_runtime import BackendUnavailableError
        try:
            import {pkg.name}
        except BackendUnavailableError as e:
            print('RAISED', e)
    """, env_extra={"KHAL_BACKEND": "vulkan"}, path=pkg.root)
    assert r.returncode == 0, r.stderr
    assert "KHAL_BACKEND='vulkan' is not a backend" in r.stdout


@pytest.mark.needs_nvrtc
def test_auto_backend_loads_without_error(pkg) -> None:
    r = _run(f"""
        import {pkg.name} as p
        print(repr(p.kernels.axpby))
    """, env_extra={"KHAL_BACKEND": "auto"}, path=pkg.root)
    assert r.returncode == 0, r.stderr
    assert "<Kernel core.axpby" in r.stdout


def test_driver_version_without_driver_raises() -> None:
    r = _run("""
        import khal_runtime
        try:
            khal_runtime.driver_version()
        except khal_runtime.BackendUnavailableError as e:
            print('RAISED', e)
        st = khal_runtime.backend_status()  # the chosen backend: none, or WebGPU on a Vulkan adapter
        assert st.backend in ('', 'webgpu'), st
        assert (st.usable and st.backend == 'webgpu') or (not st.usable and st.reason)
        print('WHY', st.why)
    """, env_extra={"KHAL_BACKEND": "auto"})
    assert r.returncode == 0, r.stderr
    assert "RAISED no CUDA device/driver was found" in r.stdout
    assert "WHY no CUDA device/driver was found" in r.stdout or "WHY CUDA is not usable (no CUDA device" in r.stdout


def test_the_install_hint_names_the_python_floor() -> None:
    """The [webgpu] extra installs wgpu-py only on Python >= 3.11 (khal-runtime's
    runtime/pyproject.toml): on 3.10 the hint says a newer Python is needed instead of advising an
    install that installs nothing."""
    from khal_runtime.backends.webgpu._wgpu import MIN_PYTHON, install_hint

    text = (ROOT / "runtime" / "pyproject.toml").read_text()
    assert f"python_version >= '{MIN_PYTHON[0]}.{MIN_PYTHON[1]}'" in text.split("webgpu = [", 1)[1].split("]")[0]
    assert install_hint((3, 12)) == "install it with pip install khal-runtime[webgpu] (or pip install wgpu)"
    old = install_hint((3, 10))
    assert old.startswith("WebGPU needs Python >= 3.11 (this is Python 3.10:")
    assert "the [webgpu] extra installs nothing here" in old
    assert old.endswith("on Python 3.11 or newer install it with pip install khal-runtime[webgpu] (or pip install wgpu)")

