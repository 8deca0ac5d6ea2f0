"""Build helpers shared by the build-side tests: run ``build_packages`` on a test project with a
reporter that records what it says, and read the manifest a build made."""

from __future__ import annotations

from pathlib import Path

from hatch_khal.builder import PrintReporter, build_packages
from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from khal_runtime.manifest import Manifest, parse_manifest
from tests.conftest import skip_without

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]


class Recorder(PrintReporter):
    def __init__(self) -> None:
        super().__init__()
        self.infos: list[str] = []
        self.warnings: list[str] = []

    def info(self, message: str) -> None:
        self.infos.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)


def _crates(root: Path):  # type: ignore[no-untyped-def]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    raw = data["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["khal"]
    return parse_config(raw, default_package="mini_pkg")[1]


def build(root: Path, cache_dir: Path | None, **kw):  # type: ignore[no-untyped-def]
    """``build_packages`` on the project at ``root``: (its result, the reporter). Skips the test
    where NVRTC is missing (every build asks it for its architectures)."""
    skip_without("needs_nvrtc")
    rep = Recorder()
    cache = Cache(cache_dir, rep.warn) if cache_dir else Cache(None)
    result = build_packages(root, _crates(root), rep, cache=cache, **kw)
    return result, rep


def manifest_of(result):  # type: ignore[no-untyped-def]
    (pkg,) = result.packages
    return parse_manifest(pkg.files["_khal/manifest.json"]), pkg.files


def worker_children(pid: int) -> list[int]:
    """The live ``hatch_khal._worker`` processes whose parent is ``pid`` (Linux: read from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"hatch_khal._worker" in cmd:
                out.append(int(d.name))
    return out


def build_test_package(src: Path, workdir: Path, package: str,
                       cache_dir: Path) -> tuple[Manifest, Path, Recorder, dict[str, bytes]]:
    """Build the test package project at ``src`` (a copy of it in ``workdir``, through the build API
    with the cache at ``cache_dir``) and write its files into the copy's ``package`` folder:
    (the manifest, that package folder, the reporter, the files by path in the package)."""
    import shutil

    skip_without("needs_nvrtc")
    root = workdir / "proj"
    shutil.copytree(src, root)
    raw = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    rep = Recorder()
    result = build_packages(root, parse_config(raw["hooks"]["khal"], default_package=package)[1], rep,
                            cache=Cache(cache_dir, rep.warn))
    (pkg,) = result.packages
    out = root / package
    for rel, data in pkg.files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return parse_manifest(pkg.files["_khal/manifest.json"]), out, rep, dict(pkg.files)
