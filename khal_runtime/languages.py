"""The run-time half of a kernel language: what the generic layers ask of a crate's language.

The build side has its :class:`hatch_khal.languages.Language`; this is its counterpart when a
package runs. A crate's manifest names its language (``Crate.language``); the generic modules
(``kernels``, the backends) never compare that name: they ask :func:`language_for` for the
language's :class:`CrateLanguage` and ask it (which crates have a WebGPU build and why the others
have none, what a crate's kernel set needs at load, the kernels' own calls, whether the crate serves
kernels host code imports).

Where a language is found, by name:

- a built-in one (:data:`LANGUAGES`: ``cuda``, ``slang``, ``triton``): its module imported on first
  use only, never by scanning: an entry-point scan costs milliseconds on the load path, which the
  built-in names never pay;
- another name: the entry point of that name in the group ``khal_runtime.languages``
  (:data:`GROUP`) of an installed distribution, loaded and checked against :class:`CrateLanguage`
  then (a missing member is a TypeError naming the entry point, its distribution and the member,
  as pluggy checks an implementation when it is registered, not at its first call);
- a name found nowhere: the plain default (:class:`PlainLanguage`): its entries launch as ordinary
  CUDA kernels, with no WebGPU build.

``runtime/pyproject.toml`` registers the built-ins in the same group, so that whatever lists the
group sees every language; :data:`LANGUAGES` answers for them first (and is all a source checkout
without installed metadata has), and a test checks the two agree. Each lookup is cached.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any, Protocol

from khal_runtime.errors import unimplemented

if TYPE_CHECKING:
    from khal_runtime.kernels import CrateKernels
    from khal_runtime.manifest import Crate

__all__ = ["CUDA", "GROUP", "LANGUAGES", "CrateLanguage", "PlainLanguage", "check_language", "language_for"]

#: the entry-point group a distribution registers a language's run-time part in
GROUP = "khal_runtime.languages"


class CrateLanguage(Protocol):
    """What the generic layers ask of a crate's language at run time. A language that needs nothing
    of its own subclasses :class:`PlainLanguage` and overrides what differs."""

    #: the name crates of the language carry (``Crate.language``)
    name: str
    #: the language as messages name it ("CUDA C++", "Slang", "Triton")
    title: str

    def webgpu_missing(self, crate: Crate) -> str | None:
        """None when ``crate`` has a WebGPU (WGSL / SPIR-V) build; else why not, as the end of a
        sentence ("its sources are CUDA C++, which only the CUDA backend runs ...")."""
        ...

    def setup(self, kernels: CrateKernels) -> None:
        """What the crate's kernel set needs when the package loads, before its launchers become its
        attributes (Triton: the instance families over the entries, ``kernels.instances``, the
        heuristics checks). Nothing for a language whose entries launch as they are."""
        ...

    def function(self, kernels: CrateKernels, name: str) -> Any:
        """``kernels.<name>`` when it is no entry: the kernel's own call (Triton's
        ``TritonFunction``), made now; None when the crate has none of that name."""
        ...

    def function_names(self, kernels: CrateKernels) -> list[str]:
        """The names :meth:`function` answers for, sorted."""
        ...

    def serves(self, crate: Crate) -> bool:
        """Whether ``crate`` serves kernels that host code imports (Triton: an entry naming its
        module, or a companion crate), which ``load`` then serves."""
        ...


#: the members every language has (checked when an entry point's language is loaded), and those of
#: them that must be callable; a test checks they are the Protocol's
MEMBERS = ("name", "title", "webgpu_missing", "setup", "function", "function_names", "serves")
CALLABLE = ("webgpu_missing", "setup", "function", "function_names", "serves")


class PlainLanguage:
    """The plain language: entries launch as ordinary CUDA kernels, one ``Kernel`` each, with no
    WebGPU build and no calls of their own. CUDA C++ is this (:data:`CUDA`), and so is a crate of a
    language with no run-time part installed; other languages subclass it."""

    def __init__(self, name: str, title: str | None = None) -> None:
        self.name = name
        self.title = title if title is not None else name

    def webgpu_missing(self, crate: Crate) -> str | None:
        return (f"its sources are {self.title}, which only the CUDA backend runs (write the crate in Slang "
                "to run it on WebGPU)")

    def setup(self, kernels: CrateKernels) -> None:
        return None

    def function(self, kernels: CrateKernels, name: str) -> Any:
        return None

    def function_names(self, kernels: CrateKernels) -> list[str]:
        return []

    def serves(self, crate: Crate) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.title})>"


#: CUDA C++ crates: the plain language
CUDA = PlainLanguage("cuda", "CUDA C++")

#: the built-in languages: name -> "module:attribute" of its CrateLanguage, imported on first use
#: only (runtime/pyproject.toml registers the same as entry points; a test checks they agree)
LANGUAGES: dict[str, str] = {
    "cuda": "khal_runtime.languages:CUDA",
    "slang": "khal_runtime.slang:SLANG",
    "triton": "khal_runtime.triton_crate:TRITON",
}


def check_language(obj: Any, name: str, where: str) -> CrateLanguage:
    """``obj`` after checking it offers every member of :class:`CrateLanguage` and is called
    ``name``; else a TypeError naming ``where`` (the entry point and its distribution) and what is
    missing."""
    lacks = unimplemented(obj, MEMBERS, CALLABLE)
    if lacks is not None:
        raise TypeError(f"kernel language {name!r} ({where}) does not implement khal_runtime.languages.CrateLanguage: "
                        f"{lacks}")
    if obj.name != name:
        raise TypeError(f"kernel language {name!r} ({where}) is called {obj.name!r}: an entry point's name is "
                        "the language's")
    return obj  # type: ignore[no-any-return]


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _from_entry_points(name: str) -> CrateLanguage | None:
    """The language an installed distribution registers as ``name`` in :data:`GROUP`, checked; None
    when none does."""
    import importlib.metadata  # lazy: scanned only for a name that is not built in

    found = {ep.value: ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == name}
    if not found:
        return None

    def where(ep: Any) -> str:
        dist = getattr(ep, "dist", None)
        return f"entry point {ep.name} = {ep.value!r} in group {GROUP} of distribution " \
               f"{getattr(dist, 'name', '?')} {getattr(dist, 'version', '')}".rstrip()

    if len(found) > 1:
        raise TypeError(f"kernel language {name!r} is registered twice: " + "; ".join(map(where, found.values())))
    (ep,) = found.values()
    try:
        obj = ep.load()
    except Exception as exc:
        raise ImportError(f"kernel language {name!r} ({where(ep)}) cannot be loaded: {type(exc).__name__}: "
                          f"{exc}") from exc
    if isinstance(obj, type):  # a class: its instance is the language
        obj = obj()
    return check_language(obj, name, where(ep))


@functools.cache
def language_for(name: str) -> CrateLanguage:
    """The run-time part of the language called ``name`` (module docstring: built in, else an entry
    point of :data:`GROUP`, else the plain default); cached (``language_for.cache_clear()``)."""
    target = LANGUAGES.get(name)
    if target is not None:
        language: CrateLanguage = _load(target)
        return language
    found = _from_entry_points(name)
    return found if found is not None else PlainLanguage(name)
