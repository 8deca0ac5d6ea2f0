"""Generated Python that a traceback and a debugger can show, on every supported Python.

The launch paths generate Python per entry (the CUDA plan's ``run`` and call, the WebGPU call
and argument resolver, the scalar packer, a Triton kernel's call, a torch operator's CUDA
kernel) and run it through :func:`define`, the one place that compiles generated code. Code
compiled from a string has no file: a traceback through it shows ``File "<string>", line 142``
and no line, and pdb cannot list it.

Where the lines are kept, and who reads them:

- **A file.** The source is written once to ``<temp dir>/khal-generated-<uid>/<what>-<sha>.py``
  (a directory only this user may write, checked; the name is the source's sha256, so the same
  code is one file for every process, and a file is never rewritten) and compiled under that
  path. Python 3.10 to 3.12 print an uncaught exception's traceback in C, reading the line
  from the file the code object names and never from :mod:`linecache`: only a real file shows
  it there. The file is written next to a temporary name and renamed, so a reader never sees
  half of it.
- **linecache.** The lines are also put in :mod:`linecache` under that name (``mtime`` None:
  ``checkcache`` keeps the entry), as attrs and dataclasses do, for ``traceback``, ``pdb``,
  ``inspect.getsource`` and 3.13's excepthook, without a read of the file; an entry lives as
  long as some function defined under its name does (regenerated code's old entries go when
  the old code is collected, so they never pile up), and the file serves after that.
- **No file** (the directory cannot be made or written): the code is compiled under a name used
  once in the process, ``<khal call five-3>``, whose lines linecache holds as above. A name in
  angle brackets is one :func:`linecache.lazycache` never attaches a module's loader to, so a
  generated function whose globals are a module's (``module=``) never shows that module's lines
  as its own.

Writing the file costs a ``stat`` when it exists already (every run but the first of a given
code), a write of a few kilobytes when not; nothing is written per launch.
"""

from __future__ import annotations

import hashlib
import itertools
import linecache
import os
import re
import stat
import threading
import weakref
from typing import Any

__all__ = ["define", "source_dir"]

_counter = itertools.count(1)
_lock = threading.Lock()
#: a generated file's name -> [its linecache entry, functions alive that were compiled under it]
_live: dict[str, list[Any]] = {}
_UNSET = "?"
_dir: str | None = _UNSET


def _temp_root() -> str:
    """The temporary directory, as :func:`tempfile.gettempdir` finds it on POSIX and Windows
    (``TMPDIR``, ``TEMP``, ``TMP``, then the platform's), without importing :mod:`tempfile`
    (its imports, ``shutil`` and ``random``, cost milliseconds, and a shader package's import
    defines a function)."""
    for var in ("TMPDIR", "TEMP", "TMP"):
        d = os.environ.get(var)
        if d and os.path.isdir(d):
            return d
    if os.name == "nt":  # pragma: no cover - POSIX here
        import tempfile  # lazy: only where none of the variables names a directory

        return tempfile.gettempdir()
    return "/tmp"  # noqa: S108 - a private directory below it, checked (source_dir)


def source_dir() -> str | None:
    """The directory generated sources are written to (``khal-generated-<uid>`` in the temporary
    directory, mode 0700), made on first use; None where it cannot be made, or is not a
    directory that this user owns and no one else may write (then no file is written)."""
    global _dir
    d = _dir
    if d is _UNSET:
        with _lock:
            if _dir is _UNSET:
                _dir = _private_dir()
            d = _dir
    return d


def _private_dir() -> str | None:
    getuid = getattr(os, "getuid", None)
    owner = str(getuid()) if getuid is not None else os.environ.get("USERNAME", "user")
    path = os.path.join(_temp_root(), f"khal-generated-{owner}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o022 or (getuid is not None and st.st_uid != getuid()):
        return None  # someone else's, a link, or writable by others: its files are not to be trusted
    return path


def _write(src: str, what: str) -> str | None:
    """The path of a file holding ``src`` (written now if it is not there), or None."""
    d = _dir if _dir is not _UNSET else source_dir()
    if d is None:
        return None
    digest = hashlib.sha256(src.encode("utf-8")).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", what).strip("-.")[:60] or "code"
    path = os.path.join(d, f"{slug}-{digest}.py")
    if os.path.exists(path):
        return path
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(src)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return path


def _release(name: str) -> None:
    """A function compiled under ``name`` was collected: drop its lines from linecache when it was
    the last (the file, if any, stays: other processes share it)."""
    with _lock:
        rec = _live.get(name)
        if rec is None:
            return
        rec[1] -= 1
        if rec[1] <= 0:
            del _live[name]
            if linecache.cache.get(name) is rec[0]:  # (not one clearcache() dropped and someone reused)
                del linecache.cache[name]


def define(src: str, what: str, namespace: dict[str, Any], function: str,
           module: dict[str, Any] | None = None) -> Any:
    """Run ``src``, compiled under the name of a file holding it (or ``<khal {what}-N>`` where no
    file can be written), whose lines linecache holds while a function compiled under that name
    lives; return the function it defines, ``function``.

    ``namespace`` is the code's globals, and the function is taken out of it (the cycle would
    keep it, and its lines, until the next garbage collection). ``module``: a module's globals
    to run the code with instead, for code that must read names the module rebinds after the
    code is made; the function is then defined in ``namespace``, its locals."""
    name = _write(src, what) or f"<khal {what}-{next(_counter)}>"
    code = compile(src, name, "exec")
    with _lock:
        rec = _live.get(name)
        if rec is None:
            rec = _live[name] = [(len(src), None, src.splitlines(True), name), 0]  # mtime None: checkcache keeps it
        linecache.cache[name] = rec[0]
        rec[1] += 1
    try:
        exec(code, namespace if module is None else module, namespace)  # noqa: S102 - the launch paths' own code
        fn = namespace.pop(function)
    except BaseException:
        _release(name)
        raise
    weakref.finalize(fn, _release, name).atexit = False
    return fn
