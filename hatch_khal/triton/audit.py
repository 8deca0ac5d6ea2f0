"""What a Triton compile read, recorded in the worker (:mod:`hatch_khal.triton.worker`) by an audit
hook (:func:`sys.addaudithook`), from the start of the crate's import to the end of its compile.

The hook sees every ``open`` (a file opened for reading: builtins ``open``, ``io.open_code`` that
the import system reads source with, ``os.open``) and every ``import``; at the end each file read,
and the file of each module imported, is classified (:meth:`Audit.facts`):

* one of the crate's own files (hashed by the plan's content hash): left out;
* owned by an installed distribution (its ``RECORD``, or ``top_level.txt`` where a distribution
  lists no files): the distribution's name and version;
* under the project's root, and no distribution's: the project's, by content (sha256, with the stat
  taken when it was first read, against which the build checks it before caching anything);
* the interpreter's (its standard library, the executable): the Python version;
* hatch-khal's own modules (the build tool: its version is in every key);
* anything else: outside the project and every installed distribution, reported by name (the
  build refuses it, as the CUDA C++ side refuses a header it cannot cover).

A file of the project that was looked for and is absent counts too (it would change the kernel by
appearing). Ownership is decided by the distributions' metadata, never by the shape of a path: a
project under a folder named ``site-packages`` or under the interpreter's prefix is still the
project, and a distribution installed in a virtual environment inside the project is still a
distribution. Not seen: folder listings (``os.listdir``, ``glob``) and files read by C code
without Python's ``open`` (a library's own ``fopen``).

This module runs in the worker only (it imports nothing of the build's dependencies).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import stat
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Audit", "python_identity"]


def python_identity() -> str:
    """The interpreter as the reads name it: its implementation and version (its standard library)."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def _writes_only(mode: Any, flags: Any) -> bool:
    """An ``open`` event that reads nothing the file held before: ``w``, ``x``, ``a`` without ``+``,
    ``w+`` (truncated first), ``os.open`` for writing only."""
    if isinstance(mode, str):
        return "w" in mode or "x" in mode or ("a" in mode and "+" not in mode)
    if isinstance(flags, int):
        return flags & os.O_ACCMODE == os.O_WRONLY or bool(flags & os.O_TRUNC)
    return False


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


#: the kernel's pseudo-filesystems: what a read there returns describes the running machine and
#: process (torch reads ``/proc/self/maps`` at import), not a source a kernel is built from; such reads
#: are neither hashed nor refused
PSEUDO = ("/proc", "/sys", "/dev")


@dataclass
class Audit:
    """The audit hook's record. :meth:`install` once per process, then :meth:`arm` / :meth:`disarm`
    around what counts; :meth:`facts` classifies what was read."""

    #: folders whose files are the build's own scratch (Triton's cache, the temporary folder)
    ignored: tuple[str, ...] = ()
    armed: bool = False
    #: path (absolute, as opened) -> (size, mtime_ns) at its first read, None when absent then
    seen: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)
    _installed: bool = False

    def install(self) -> None:
        if not self._installed:
            sys.addaudithook(self._hook)
            self._installed = True

    def arm(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.armed:
            return
        try:
            if event == "open":
                self._opened(*args[:3])
            elif event == "import":
                self.modules.add(str(args[0]))
        except Exception:  # noqa: BLE001 - an audit hook that raises would fail the open itself
            pass

    def _opened(self, path: Any, mode: Any = None, flags: Any = None) -> None:
        if isinstance(path, int) or path is None or _writes_only(mode, flags):
            return
        name = _source_of(os.path.abspath(os.fsdecode(path)))
        if name in self.seen or any(_under(name, d) for d in self.ignored) or any(_under(name, d) for d in PSEUDO):
            return
        try:
            st = os.stat(name)
        except OSError:
            self.seen[name] = None
            return
        if stat.S_ISREG(st.st_mode):
            self.seen[name] = (st.st_size, st.st_mtime_ns)

    def module_files(self, before: set[str]) -> set[str]:
        """The files of the modules imported while armed (and of any module new since ``before``)."""
        out: set[str] = set()
        for name in self.modules | (set(sys.modules) - before):
            path = getattr(sys.modules.get(name), "__file__", None)
            if isinstance(path, str) and os.path.isfile(path):
                out.add(os.path.abspath(path))
        return out

    def facts(self, root: str, crate_files: list[str], tool_dirs: list[str], before: set[str]) -> dict[str, Any]:
        """What was read, classified (module docstring): ``{"python": version, "dists": [[name,
        version], ...], "project": [[rel, sha256 or None, size, mtime_ns], ...], "outside": [path,
        ...]}``, each sorted. ``root``: the project's root; ``crate_files``: the crate's hashed files
        (real paths); ``tool_dirs``: hatch-khal's package folders; ``before``: ``sys.modules``'
        names when armed."""
        reads: dict[str, tuple[int, int] | None] = {}
        reads.update(self.seen)
        for path in self.module_files(before):
            if path not in reads and not any(_under(path, d) for d in self.ignored):
                try:
                    st0 = os.stat(path)
                except OSError:
                    continue
                reads[path] = (st0.st_size, st0.st_mtime_ns)
        owners = _Owners()
        crate = {os.path.realpath(f) for f in crate_files}
        real_root = os.path.realpath(root)
        interpreter = _interpreter()
        dists: set[tuple[str, str]] = set()
        project: dict[str, list[Any]] = {}
        outside: set[str] = set()
        for path, st in sorted(reads.items()):
            real = os.path.realpath(path)
            if real in crate or path in crate:
                continue
            if st is None:  # looked for, absent: the project's absence counts; elsewhere unseen
                if _under(real, real_root):
                    project[_rel(real, real_root)] = [_rel(real, real_root), None, -1, -1]
                continue
            owner = owners.owner(path, real)
            if owner is not None:
                dists.add(owner)
            elif _under(real, real_root):
                rel = _rel(real, real_root)
                project[rel] = [rel, _sha256(real), st[0], st[1]]
            elif interpreter.has(path, real):
                continue
            elif any(_under(real, d) or _under(path, d) for d in tool_dirs):
                continue
            else:
                outside.add(path)
        return {"python": python_identity(), "dists": sorted([n, v] for n, v in dists),
                "project": [project[k] for k in sorted(project)], "outside": sorted(outside)}


def _rel(real: str, root: str) -> str:
    return os.path.relpath(real, root).replace(os.sep, "/")


def _sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _source_of(path: str) -> str:
    """A cached module (``__pycache__/m.cpython-311.pyc``) as its source file, which the import read
    it for (Python checks the cache against the source's size and mtime); any other path as it is."""
    if path.endswith(".pyc") and "__pycache__" in path:
        try:
            source = importlib.util.source_from_cache(path)
        except ValueError:
            return path
        if os.path.isfile(source):
            return source
    return path


class _Interpreter:
    def __init__(self, dirs: list[str], sites: list[str], files: set[str]) -> None:
        self.dirs, self.sites, self.files = dirs, sites, files

    def has(self, path: str, real: str) -> bool:
        if path in self.files or real in self.files:
            return True
        return any(_under(real, d) for d in self.dirs) and not any(_under(real, s) for s in self.sites)


def _interpreter() -> _Interpreter:
    """The interpreter's files: its standard library folders (of the environment and of the base
    installation), less the site-packages folders that may lie under them; its executable."""
    dirs: set[str] = set()
    sites: set[str] = set()
    for scheme_vars in (None, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                               "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=scheme_vars) if scheme_vars else sysconfig.get_paths()
        dirs |= {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
        sites |= {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    import site  # lazy: only when a file is classified

    try:
        sites |= {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    except AttributeError:  # an interpreter whose site module lacks them (embedded)
        pass
    exe = {sys.executable, getattr(sys, "_base_executable", sys.executable)}
    files = exe | {os.path.realpath(e) for e in exe}
    return _Interpreter(sorted(dirs), sorted(sites), files)


class _Owners:
    """Which installed distribution owns a file: every distribution's ``RECORD`` (or its
    ``installed-files.txt``, through :mod:`importlib.metadata`), else its ``top_level.txt`` names;
    built once, when first asked."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[str, str]] | None = None
        self._tops: list[tuple[str, tuple[str, str]]] = []

    def _index(self) -> dict[str, tuple[str, str]]:
        if self._files is not None:
            return self._files
        from importlib import metadata  # lazy: only when a file is classified

        files: dict[str, tuple[str, str]] = {}
        for dist in metadata.distributions():
            try:
                name = dist.metadata["Name"]
                ident = (str(name), str(dist.version))
                base = str(dist.locate_file(""))
                listed = dist.files
            except Exception:  # noqa: BLE001 - a broken installation owns nothing
                continue
            if not name:
                continue
            bases = {os.path.normpath(base), os.path.realpath(base)}
            if listed:
                for f in listed:
                    for b in bases:
                        files.setdefault(os.path.normpath(os.path.join(b, str(f))), ident)
                continue
            for top in (dist.read_text("top_level.txt") or "").split():
                for b in bases:
                    self._tops.append((os.path.join(b, top), ident))
        self._files = files
        return files

    def owner(self, path: str, real: str) -> tuple[str, str] | None:
        files = self._index()
        for p in (os.path.normpath(path), real):
            if p in files:
                return files[p]
        for top, ident in self._tops:
            if _under(real, top) or real == top + ".py" or _under(path, top):
                return ident
        return None
