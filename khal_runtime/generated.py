"""Generated Python that a traceback and a debugger can show.

The launch paths generate Python per entry (the CUDA plan's ``run`` and call, the WebGPU call
and argument resolver, the scalar packer) and ``exec`` it. Code compiled from a string has no
file, so a traceback through it shows ``File "<khal call five>", line 142`` and no line, and
pdb cannot list it. :func:`define` compiles under a name used once in the process
(``<khal call five-3>``: the counter keeps two plans, and two generations of one plan, apart)
and puts the source in :mod:`linecache` under that name, as attrs and dataclasses do, so
tracebacks, ``pdb`` and ``inspect.getsource`` read it from there.

An entry lives as long as the function it defined: it is dropped when that function is
collected (a regenerated plan's old code, once no frame or traceback holds it), so
regenerating never piles entries up.
"""

from __future__ import annotations

import itertools
import linecache
import weakref
from typing import Any

__all__ = ["define"]

_counter = itertools.count(1)


def _forget(name: str, entry: tuple[Any, ...]) -> None:
    if linecache.cache.get(name) is entry:  # (not one linecache.clearcache() dropped and someone reused)
        del linecache.cache[name]


def define(src: str, what: str, namespace: dict[str, Any], function: str) -> Any:
    """Run ``src`` in ``namespace``, compiled under a new name ``<khal {what}-N>`` whose lines
    linecache holds while the function it defines, ``function``, lives; return that function.
    (It is taken out of ``namespace``: the namespace is its globals, and the cycle would keep
    it, and its lines, until the next garbage collection.)"""
    name = f"<khal {what}-{next(_counter)}>"
    code = compile(src, name, "exec")
    entry = (len(src), None, src.splitlines(True), name)  # mtime None: checkcache() keeps it
    linecache.cache[name] = entry
    try:
        exec(code, namespace)
        fn = namespace.pop(function)
    except BaseException:
        _forget(name, entry)
        raise
    weakref.finalize(fn, _forget, name, entry).atexit = False
    return fn
