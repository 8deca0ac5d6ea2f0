"""Companion crates: a Triton crate whose sources are an installed library's modules (crate option
``modules = ["liger_kernel.ops.rms_norm", ...]``), so that a small wheel ships that library's
kernels precompiled without copying its code.

At planning, in the hook's process and without importing the library (its modules are found on
``sys.path`` by the import system's path finder, which executes nothing): the distribution the
modules' top-level package belongs to (``importlib.metadata``), its version, the module files and
their digests (:class:`Served`). The project must pin that distribution in its
``[build-system] requires`` (``liger-kernel==0.8.5``), at the version installed: the crate's content
hash covers the version and the files, and the manifest records them
(``Crate.triton.serves``) so that the runtime refuses to serve another version.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from hatch_khal.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Served", "resolve"]


@dataclass(frozen=True)
class Served:
    """The library a companion crate serves."""

    distribution: str
    version: str
    #: the folder the distribution is installed in (its files are named relative to it)
    root: Path
    #: the folders of its top-level packages (the @triton.jit helpers a kernel may call from there are
    #: covered by the pinned version)
    packages: tuple[str, ...]
    #: module name -> its file, relative to ``root`` (POSIX)
    modules: dict[str, str]
    #: file relative to ``root`` -> sha256 of its bytes
    digests: dict[str, str]

    def record(self) -> dict[str, Any]:
        """What the crate's content hash covers of it."""
        return {"distribution": self.distribution, "version": self.version, "modules": self.modules,
                "files": self.digests}

    def digest(self, rel: str) -> str:
        return hashlib.sha256((self.root / rel).read_bytes()).hexdigest()


def _module_file(crate: str, name: str) -> tuple[str, Path]:
    """The file of module ``name`` and the folder of its top-level package, found by the path finder
    (no module is executed)."""
    parts = name.split(".")
    path: list[str] | None = None
    top = ""
    spec = None
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), path)
        if spec is None:
            raise ConfigError(f"crate {crate!r}: option 'modules' names {name!r}, which is not installed in the build "
                              f"environment ({'.'.join(parts[:i + 1])} not found): add the library to the project's "
                              "[build-system] requires, pinned (library==version)")
        if i == 0:
            top = (spec.origin or "") if spec.submodule_search_locations is None else \
                list(spec.submodule_search_locations)[0]
        if i < len(parts) - 1:
            if spec.submodule_search_locations is None:
                raise ConfigError(f"crate {crate!r}: option 'modules' names {name!r}, but {'.'.join(parts[:i + 1])} is "
                                  "a module, not a package")
            path = list(spec.submodule_search_locations)
    assert spec is not None
    if spec.origin is None or not spec.origin.endswith(".py") or not os.path.isfile(spec.origin):
        raise ConfigError(f"crate {crate!r}: option 'modules' names {name!r}, which is not a Python source file "
                          f"({spec.origin}); name the modules that define the @triton.jit kernels")
    return spec.origin, Path(top or spec.origin)


def _distribution(crate: str, name: str) -> metadata.Distribution:
    top = name.split(".")[0]
    dists = sorted(set(metadata.packages_distributions().get(top, [])))
    if len(dists) != 1:
        what = f"distributions {', '.join(dists)} all provide" if dists else "no installed distribution provides"
        raise ConfigError(f"crate {crate!r}: option 'modules' names {name!r}, and {what} package {top!r}: a companion "
                          "crate serves the modules of one installed library, pinned in [build-system] requires")
    return metadata.distribution(dists[0])


def check_pinned(root: Path, crate: str, distribution: str, version: str) -> None:
    """The project's ``[build-system] requires`` must pin ``distribution`` at ``version`` (the one
    installed): ``name==version``."""
    pyproject = root / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"crate {crate!r} serves {distribution} {version}, which the project's [build-system] "
                          f"requires must pin; {pyproject} cannot be read: {exc}") from None
    requires = data.get("build-system", {}).get("requires", [])
    pin = f"{distribution}=={version}"
    for text in requires if isinstance(requires, list) else []:
        try:
            req = Requirement(str(text))
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != canonicalize_name(distribution):
            continue
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
            raise ConfigError(f"crate {crate!r} serves {distribution}, which the project's [build-system] requires "
                              f"gives as {str(text)!r}: pin it to one version ({pin!r}); the companion's binaries "
                              "and the manifest are for one version of the library")
        if not specs[0].contains(version):
            raise ConfigError(f"crate {crate!r}: the project's [build-system] requires pins {str(text)!r}, but "
                              f"{distribution} {version} is installed in the build environment; build in the "
                              f"isolated environment, or pin {pin!r}")
        return
    raise ConfigError(f"crate {crate!r} serves {distribution} {version}: add {pin!r} to the project's [build-system] "
                      "requires (pinned: the companion's binaries and the manifest are for one version)")


def resolve(root: Path, crate: str, modules: list[str]) -> Served:
    """The installed library the companion crate's ``modules`` belong to (one distribution), checked
    pinned in the project's ``[build-system] requires``. ConfigError naming the crate and the module."""
    dists = {name: _distribution(crate, name) for name in modules}
    names = sorted({canonicalize_name(d.metadata["Name"]) for d in dists.values()})
    if len(names) != 1:
        raise ConfigError(f"crate {crate!r}: option 'modules' names modules of several distributions ({', '.join(names)}); "
                          "a companion crate serves one library: give each its own crate")
    dist = next(iter(dists.values()))
    distribution, version = str(dist.metadata["Name"]), str(dist.version)
    check_pinned(root, crate, distribution, version)
    site = Path(str(dist.locate_file(""))).resolve()
    files: dict[str, str] = {}
    packages = set()
    for name in modules:
        path, top = _module_file(crate, name)
        real = Path(path).resolve()
        try:
            rel = real.relative_to(site).as_posix()
        except ValueError:
            raise ConfigError(f"crate {crate!r}: module {name!r} is {real}, outside {distribution}'s install folder "
                              f"({site}); an editable install of the library cannot be served: install it "
                              "(pinned) in the build environment") from None
        files[name] = rel
        packages.add(str(top.resolve()) + os.sep if top.is_dir() else str(top.resolve()))
    digests = {rel: hashlib.sha256((site / rel).read_bytes()).hexdigest() for rel in sorted(set(files.values()))}
    return Served(distribution=distribution, version=version, root=site, packages=tuple(sorted(packages)),
                  modules=files, digests=digests)
