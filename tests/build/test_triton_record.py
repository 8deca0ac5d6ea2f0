"""``python -m hatch_khal triton record -- CMD`` (hatch_khal/triton/record.py, record_child.py):
the variants Triton's JIT compiles for the launches of a command, into the lock file.

Each test records a real command in a project of its own, as a user would:

* the JIT's path (``jit_cache_hook``, ``JITFunction.run``, ``Autotuner.run``) runs Triton's own
  launch code on a stand-in driver (no GPU: the target, the stream, the benchmarker), with the
  program's own ``jit_cache_hook`` skipping the compile: what the hook sees is what a GPU run's
  compile gets; nothing is launched, so no launch is counted there;
* Triton's interpreter (``TRITON_INTERPRET=1``) runs kernels of scalars without torch here, and of
  CPU tensors where torch is installed (those tests skip without it);
* the real JIT on a GPU: ``test_the_jits_launches_on_a_gpu_are_recorded_and_counted`` (marker gpu).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.triton import lock
from hatch_khal.triton.lock import LockVariant
from khal_runtime.manifest import TritonDtype
from tests.helpers.paths import PACKAGES

pytestmark = pytest.mark.needs_triton

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = PACKAGES / "triton_kernels_pkg" / "kernels" / "triton" / "tutorials.py"

PYPROJECT = """\
[project]
name = "recproj"
version = "0.1"
requires-python = ">=3.10"

[tool.hatch.build.targets.wheel.hooks.khal]

[[tool.hatch.build.targets.wheel.hooks.khal.crates]]
name = "k"
sources = ["kernels/*.py"]
"""

KERNELS = '''\
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["d"])
def scalars(n, m, scale, big, opt, d, MODE: tl.constexpr, BLOCK: tl.constexpr, DT: tl.constexpr, OPT: tl.constexpr):
    x = tl.arange(0, BLOCK) + n * m + d


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + o * stride, tl.load(x_ptr + o) + tl.load(y_ptr + o), mask=o < n)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4),
                          triton.Config({"BLOCK": 256}, num_warps=8, num_stages=2, maxnreg=128)], key=["n"])
@triton.heuristics({"EVEN": lambda a: a["n"] % 256 == 0})
@triton.jit
def tuned(x_ptr, n, flag, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    pass
'''

#: a script's preamble: the crate's folder importable (as a test suite would)
PRELUDE = """\
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels"))
import triton
import triton.language as tl
"""

#: Triton's JIT launch path without a GPU: a stand-in driver, tensors as its binder reads them, and
#: the program's own compile hook that skips the compile (and says it was called)
FAKE_GPU = PRELUDE + """\
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class FakeDriver:
    def get_current_device(self): return 0
    def get_current_stream(self, device): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_benchmarker(self):
        def bench(fn, quantiles=None):
            fn()
            return [1.0, 1.0, 1.0]
        return bench


class T:
    def __init__(self, ptr, dtype="float32"):
        self.ptr, self.dtype = ptr, dtype
    def data_ptr(self): return self.ptr


driver.set_active(FakeDriver())
programs_hook = []
def mine(**kw):
    programs_hook.append(kw["fn"].name)
    return True  # skip the compile: no GPU here
triton.knobs.runtime.jit_cache_hook = mine
"""


def _project(tmp_path: Path, pyproject: str = PYPROJECT, kernels: str = KERNELS) -> Path:
    project = tmp_path / "proj"
    (project / "kernels").mkdir(parents=True)
    (project / "pyproject.toml").write_text(pyproject)
    (project / "kernels" / "kern.py").write_text(kernels)
    return project


def _record(project: Path, *command: str, args: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env.pop("PYTHONPATH")] if "PYTHONPATH" in env else []))
    full.update(env)
    return subprocess.run([sys.executable, "-m", "hatch_khal", "triton", "record", "--project", str(project), *args,
                           "--", *command], cwd=project, env=full, capture_output=True, text=True, timeout=600)


def _script(project: Path, name: str, text: str) -> str:
    (project / name).write_text(text)
    return str(project / name)


def _launches(project: Path) -> dict[str, Any]:
    return json.loads((project / "khal-triton.lock.launches.json").read_text())  # type: ignore[no-any-return]


def _v(kernel: str, args: dict[str, str], constexprs: dict[str, Any], **options: Any) -> LockVariant:
    return LockVariant(crate="k", kernel=kernel, args=args, constexprs=constexprs,
                       **{"num_warps": 4, "num_stages": 3, **options})


ADD_ALIGNED = _v("add_kernel", {"x_ptr": "*fp32:16", "y_ptr": "*fp32:16", "out_ptr": "*fp32:16", "n": "i32:16",
                                "stride": "i32:1"}, {"BLOCK": 128})
ADD_RAGGED = _v("add_kernel", {"x_ptr": "*fp32", "y_ptr": "*bf16:16", "out_ptr": "*fp32:16", "n": "i32",
                               "stride": "i32"}, {"BLOCK": 128}, num_warps=2, num_ctas=2)
TUNED = [_v("tuned", {"x_ptr": "*fp32:16", "n": "i32:16", "flag": "u1"}, {"BLOCK": 128, "EVEN": True}, config=0),
         _v("tuned", {"x_ptr": "*fp32:16", "n": "i32:16", "flag": "u1"}, {"BLOCK": 256, "EVEN": True}, num_warps=8,
            num_stages=2, maxnreg=128, config=1)]


def test_the_jits_compiles_are_recorded_with_their_specialisation_options_and_autotune_config(tmp_path: Path) -> None:
    project = _project(tmp_path)
    script = _script(project, "run.py", FAKE_GPU + textwrap.dedent("""\
        from kern import add_kernel, tuned
        add_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)
        add_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)   # the same variant
        add_kernel[(1,)](T(1028), T(2048, "bfloat16"), T(4096), 1000, 2, BLOCK=128, num_warps=2, num_ctas=2)
        tuned[(1,)](T(64), 512, True)
        print("program's hook:", programs_hook)
    """))
    out = _record(project, sys.executable, script)
    assert out.returncode == 0, out.stdout + out.stderr
    assert lock.read(project / "khal-triton.lock") == lock.merge([], [ADD_ALIGNED, ADD_RAGGED, *TUNED])
    # the program's own hook, set after ours, was chained: it saw every compile (it skips each, so Triton
    # compiles a repeated launch again; two configs benchmarked, then the chosen one launched)
    assert "program's hook: ['add_kernel', 'add_kernel', 'add_kernel', 'tuned', 'tuned', 'tuned']" in out.stdout
    assert "k      add_kernel         2    2         0" in out.stdout
    assert "4 variant(s) of 2 kernel(s) seen in 0 launch(es), 4 new" in out.stdout


def test_the_interpreters_launches_are_specialised_as_the_jit_would_and_counted(tmp_path: Path) -> None:
    """TRITON_INTERPRET=1: no GPU, no torch (a kernel of scalars); run through pytest, as a package's tests."""
    project = _project(tmp_path)
    _script(project, "test_scalars.py", PRELUDE + textwrap.dedent("""\
        from kern import scalars

        def test_launches():
            for n in (16, 16, 1, 17):
                scalars[(1,)](n, 3, 0.5, 2**40, None, 16, "mean", 4, tl.float16, None, num_warps=8)
            scalars[(1,)](16, 3, 1.5, 2**63 + 16, 7, 1, MODE="sum", BLOCK=4, DT=tl.int8, OPT=2.5)
    """))
    out = _record(project, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_scalars.py",
                  TRITON_INTERPRET="1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
    first = {"m": "i32", "scale": "fp32", "big": "i64:16", "opt": "none", "d": "i32"}
    cx = {"MODE": "mean", "BLOCK": 4, "DT": TritonDtype(dtype="fp16"), "OPT": None}
    expected = [_v("scalars", {"n": "i32:16", **first}, cx, num_warps=8),
                _v("scalars", {"n": "i32:1", **first}, cx, num_warps=8),
                _v("scalars", {"n": "i32", **first}, cx, num_warps=8),
                _v("scalars", {"n": "i32:16", "m": "i32", "scale": "fp32", "big": "u64:16", "opt": "i32", "d": "i32"},
                   {"MODE": "sum", "BLOCK": 4, "DT": TritonDtype(dtype="int8"), "OPT": 2.5})]
    assert lock.read(project / "khal-triton.lock") == lock.merge([], expected)
    counts = {LockVariant.from_json(v["variant"], "x"): v["launches"] for v in _launches(project)["variants"]}
    assert counts == dict(zip(expected, [2, 1, 1, 1]))
    assert _launches(project)["interpreted"] is True
    assert "5 launch(es), 4 new" in out.stdout


def test_a_re_record_merges_and_replace_drops_the_old_entries(tmp_path: Path) -> None:
    project = _project(tmp_path)
    first = _script(project, "a.py", FAKE_GPU + "from kern import add_kernel\n"
                    "add_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)\n")
    second = _script(project, "b.py", FAKE_GPU + "from kern import add_kernel\n"
                     "add_kernel[(1,)](T(1028), T(2048, 'bfloat16'), T(4096), 1000, 2, BLOCK=128, num_warps=2, "
                     "num_ctas=2)\n")
    assert _record(project, sys.executable, first).returncode == 0
    text = (project / "khal-triton.lock").read_text()
    out = _record(project, sys.executable, first)
    assert "1 variant(s) of 1 kernel(s) seen in 0 launch(es), 0 new" in out.stdout
    assert (project / "khal-triton.lock").read_text() == text  # nothing new: the same bytes
    assert _record(project, sys.executable, second).returncode == 0
    assert lock.read(project / "khal-triton.lock") == [ADD_RAGGED, ADD_ALIGNED]
    out = _record(project, sys.executable, second, args=("--replace",))
    assert "(1 dropped: --replace)" in out.stdout
    assert lock.read(project / "khal-triton.lock") == [ADD_RAGGED]


def test_a_failing_command_keeps_what_it_launched_and_exits_with_its_status(tmp_path: Path) -> None:
    project = _project(tmp_path)
    script = _script(project, "run.py", FAKE_GPU + "from kern import add_kernel\n"
                     "add_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)\nsys.exit(3)\n")
    out = _record(project, sys.executable, script)
    assert out.returncode == 3
    assert "the command exited with status 3; what it launched before is recorded" in out.stdout
    assert lock.read(project / "khal-triton.lock") == [ADD_ALIGNED]
    assert _launches(project)["returncode"] == 3


def test_a_command_launching_no_kernel_of_the_crates_says_which_kernels_it_launched(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "elsewhere").mkdir()
    (project / "elsewhere" / "other.py").write_text(KERNELS.replace("def add_kernel", "def other_add"))
    script = _script(project, "run.py", FAKE_GPU.replace('"kernels"', '"elsewhere"') + "from other import other_add\n"
                     "other_add[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)\n")
    out = _record(project, sys.executable, script)
    assert out.returncode == 1
    assert "no launch of a kernel of the Triton crate(s) k was seen" in out.stdout
    assert f"other.other_add ({project / 'elsewhere' / 'other.py'}): 1 launch(es)" in out.stdout
    assert not (project / "khal-triton.lock").exists()


def test_a_command_that_runs_no_python_says_the_recorder_never_started(tmp_path: Path) -> None:
    project = _project(tmp_path)
    out = _record(project, sys.executable, "-I", "-c", "pass")  # -I ignores PYTHONPATH
    assert out.returncode == 1
    assert "no Python process of the command started the recorder" in out.stdout


def test_a_sitecustomize_already_on_the_path_still_runs(tmp_path: Path) -> None:
    project = _project(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    script = _script(project, "run.py", FAKE_GPU + "from kern import add_kernel\n"
                     "add_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)\n"
                     "print('theirs:', os.environ.get('THEIRS'))\n")
    out = _record(project, sys.executable, script, PYTHONPATH=str(site))
    assert out.returncode == 0, out.stderr
    assert "theirs: ran" in out.stdout and lock.read(project / "khal-triton.lock") == [ADD_ALIGNED]


def test_launches_in_a_forked_child_and_a_subprocess_are_counted_once_each(tmp_path: Path) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    project = _project(tmp_path)
    script = _script(project, "run.py", PRELUDE + textwrap.dedent("""\
        import subprocess
        from kern import scalars

        def launch():
            scalars[(1,)](16, 3, 0.5, 2**40, None, 16, "mean", 4, tl.float16, None)

        launch()
        pid = os.fork()
        if pid == 0:
            launch()
            os._exit(0)  # as a multiprocessing worker ends: no atexit
        os.waitpid(pid, 0)
        subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = sys.argv[1:2]; import run_one"
                        , os.path.dirname(os.path.abspath(__file__))], check=True)
    """))
    _script(project, "run_one.py", PRELUDE + "from kern import scalars\n"
            "scalars[(1,)](16, 3, 0.5, 2**40, None, 16, 'mean', 4, tl.float16, None)\n")
    out = _record(project, sys.executable, script, TRITON_INTERPRET="1")
    assert out.returncode == 0, out.stdout + out.stderr
    data = _launches(project)
    assert data["processes"] >= 3 and [v["launches"] for v in data["variants"]] == [3]


def test_a_copy_of_a_crate_source_elsewhere_is_the_crates(tmp_path: Path) -> None:
    """An installed package imports its copy of the crate's file, not the project's."""
    project = _project(tmp_path)
    (tmp_path / "installed").mkdir()
    shutil.copy(project / "kernels" / "kern.py", tmp_path / "installed" / "kern.py")
    script = _script(project, "run.py", FAKE_GPU.replace(
        'os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")', repr(str(tmp_path / "installed")))
        + "from kern import add_kernel\nadd_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)\n")
    out = _record(project, sys.executable, script)
    assert out.returncode == 0, out.stdout + out.stderr
    assert lock.read(project / "khal-triton.lock") == [ADD_ALIGNED]


def test_a_companion_crates_modules_a_setuptools_table_and_the_lock_option(tmp_path: Path) -> None:
    pyproject = PYPROJECT.split("[tool.hatch")[0] + textwrap.dedent("""\
        [tool.khal]
        triton-lock = "locks/triton.lock"

        [[tool.khal.crates]]
        name = "lib"
        modules = ["recmods.kern"]
        """)
    project = _project(tmp_path, pyproject)
    (project / "recmods").mkdir()
    shutil.move(str(project / "kernels" / "kern.py"), project / "recmods" / "kern.py")
    script = _script(project, "run.py", FAKE_GPU.replace('"kernels"', '""') + "from recmods.kern import add_kernel\n"
                     "add_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)\n")
    out = _record(project, sys.executable, script)
    assert out.returncode == 0, out.stdout + out.stderr
    (v,) = lock.read(project / "locks" / "triton.lock")
    assert (v.crate, v.kernel, v.module) == ("lib", "add_kernel", "recmods.kern")
    assert (project / "locks" / "triton.lock.launches.json").is_file()
    out = _record(project, sys.executable, script, args=("--lock", str(tmp_path / "other.lock")))
    assert len(lock.read(tmp_path / "other.lock")) == 1


@pytest.mark.parametrize("setup, args, message", [
    (lambda p: None, ("--crate", "nope"), r"--crate nope: no Triton crate of that name .* \(its Triton crates: k\)"),
    (lambda p: (p / "pyproject.toml").unlink(), (), r"no pyproject.toml; --project DIR names the project"),
    (lambda p: (p / "pyproject.toml").write_text(PYPROJECT.replace("kernels/*.py", "kernels/*.cu")), (),
     r"the project has no Triton crate"),
    (lambda p: (p / "pyproject.toml").write_text(PYPROJECT.replace("kernels/*.py", "nothing/*.py")), (),
     r"crates\[0\] 'k': source pattern 'nothing/\*.py' matches no file"),
])
def test_a_bad_command_line_or_project_is_refused_by_name(tmp_path: Path, setup: Any, args: tuple[str, ...],
                                                          message: str) -> None:
    project = _project(tmp_path)
    setup(project)
    out = _record(project, sys.executable, "-c", "pass", args=args)
    assert out.returncode == 2
    assert pytest.importorskip("re").search(message, out.stderr), out.stderr


def test_a_lock_file_that_does_not_read_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "khal-triton.lock").write_text("version = 1\n\n[[variant]]\ncrate = 3\nkernel = \"k\"\nnum_warps = 4\nnum_stages = 3\n")
    out = _record(project, sys.executable, "-c", "open('ran', 'w')")
    assert out.returncode == 2 and not (project / "ran").exists()
    assert "khal-triton.lock: variant[0] (line 3): field 'crate': 3 is not a crate name" in out.stderr
    # --replace (of every crate) does not read it: it is written anew
    script = _script(project, "run.py", FAKE_GPU + "from kern import add_kernel\n"
                     "add_kernel[(1,)](T(1024), T(2048), T(4096), 1024, 1, BLOCK=128)\n")
    assert _record(project, sys.executable, script, args=("--replace",)).returncode == 0
    assert lock.read(project / "khal-triton.lock") == [ADD_ALIGNED]


def test_no_command_is_refused(tmp_path: Path) -> None:
    project = _project(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hatch_khal", "triton", "record", "--project", str(project)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "no command to run: give it after `--`" in out.stderr


# -- with torch (CPU tensors in the interpreter; CUDA tensors on a GPU) ---------------------------


def _torch_project(tmp_path: Path) -> Path:
    """The tutorials' kernels (and the helper module they import) as the crate."""
    project = _project(tmp_path, kernels=TUTORIALS.read_text())
    shutil.copy(TUTORIALS.parent / "helpers.py", project / "kernels" / "helpers.py")
    return project


def test_the_interpreters_launches_with_cpu_tensors_are_specialised_by_their_addresses(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed (not in the test extra)")
    project = _torch_project(tmp_path)
    script = _script(project, "run.py", PRELUDE + textwrap.dedent("""\
        import torch
        from kern import add_kernel
        x = torch.rand(4096); y = torch.rand(4096); out = torch.empty(4096)
        for n in (4096, 1000):
            add_kernel[(4,)](x, y, out, n, BLOCK_SIZE=1024)
        add_kernel[(4,)](x[1:], y[1:], out[1:], 4000, BLOCK_SIZE=1024)  # 4 bytes in: not 16-byte aligned
        assert torch.allclose(out[1:4001], x[1:4001] + y[1:4001])
    """))
    out = _record(project, sys.executable, script, TRITON_INTERPRET="1")
    assert out.returncode == 0, out.stdout + out.stderr
    ptrs = ("x_ptr", "y_ptr", "output_ptr")
    got = lock.read(project / "khal-triton.lock")
    assert got == lock.merge([], [
        _v("add_kernel", {**{p: "*fp32:16" for p in ptrs}, "n_elements": "i32:16"}, {"BLOCK_SIZE": 1024}),
        _v("add_kernel", {**{p: "*fp32:16" for p in ptrs}, "n_elements": "i32"}, {"BLOCK_SIZE": 1024}),
        _v("add_kernel", {**{p: "*fp32" for p in ptrs}, "n_elements": "i32:16"}, {"BLOCK_SIZE": 1024})])
    assert sorted(v["launches"] for v in _launches(project)["variants"]) == [1, 1, 1]


@pytest.mark.gpu
def test_the_jits_launches_on_a_gpu_are_recorded_and_counted(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed")
    project = _torch_project(tmp_path)
    script = _script(project, "run.py", PRELUDE + textwrap.dedent("""\
        import torch
        from kern import add_kernel
        x = torch.rand(98432, device="cuda"); y = torch.rand_like(x); out = torch.empty_like(x)
        for _ in range(3):
            add_kernel[(97,)](x, y, out, 98432, BLOCK_SIZE=1024)
        add_kernel[(97,)](x[1:], y[1:], out[1:], 98431, BLOCK_SIZE=1024, num_warps=8)
        torch.cuda.synchronize()
        assert torch.allclose(out[1:], x[1:] + y[1:])
    """))
    out = _record(project, sys.executable, script)
    assert out.returncode == 0, out.stdout + out.stderr
    ptrs = ("x_ptr", "y_ptr", "output_ptr")
    aligned = _v("add_kernel", {**{p: "*fp32:16" for p in ptrs}, "n_elements": "i32:16"}, {"BLOCK_SIZE": 1024})
    ragged = _v("add_kernel", {**{p: "*fp32" for p in ptrs}, "n_elements": "i32"}, {"BLOCK_SIZE": 1024}, num_warps=8)
    assert lock.read(project / "khal-triton.lock") == lock.merge([], [aligned, ragged])
    counts = {LockVariant.from_json(v["variant"], "x"): v["launches"] for v in _launches(project)["variants"]}
    assert counts == {aligned: 3, ragged: 1}
