"""Triton's run-time part (:class:`~khal_runtime.languages.CrateLanguage`): what a Triton crate's
kernel set is made of when its package loads, and its kernels' own calls.

- The crate's launchers are its instance families (:class:`~khal_runtime.triton.TritonKernel`, one
  over the instance as written and its ``__base`` twin: launching a specialised entry unchecked
  could give wrong results); the raw entries stay in ``kernels.instances``.
- A family of a kernel with ``@triton.heuristics`` checks each call against them
  (:func:`~khal_runtime.triton_host.heuristic_check`).
- ``kernels.<kernel>`` is the kernel's own call (:class:`~khal_runtime.triton_call.TritonFunction`)
  over every variant recording its signature, made when first asked for.
- A crate whose entries name their module, or a companion crate, serves the kernels host code
  imports (:mod:`khal_runtime.triton_serve`).

What it keeps of a crate besides ``instances`` lives in the crate's ``__dict__`` under keys of its
own (``_hosts``, ``_triton_functions``), read only here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from khal_runtime.languages import PlainLanguage
from khal_runtime.triton import TritonKernel

if TYPE_CHECKING:
    from khal_runtime.kernels import CrateKernels, Kernel
    from khal_runtime.manifest import Crate
    from khal_runtime.triton_host import Host

__all__ = ["TRITON", "TritonLanguage"]


class TritonLanguage(PlainLanguage):
    """Triton crates: instance families, heuristics checks, own calls, served modules."""

    def setup(self, kernels: CrateKernels) -> None:
        instances: dict[str, Kernel] = {k.name: k for k in kernels}
        kernels.instances = instances
        families: dict[str, list[Kernel]] = {}
        for k in instances.values():
            families.setdefault(k.entry.triton.family, []).append(k)  # type: ignore[union-attr]
        kernels.replace_kernels({f: TritonKernel(f, kernels.name, ks) for f, ks in families.items()})
        if any(k.entry.triton.heuristics for k in instances.values()):  # type: ignore[union-attr]
            self._check_heuristics(kernels)

    def _check_heuristics(self, kernels: CrateKernels) -> None:
        """Instance families of a kernel with ``@triton.heuristics``: each call checks that the
        heuristics compute the values its variants were compiled with (where the kernel's module
        can be read at run time)."""
        from khal_runtime.triton_host import heuristic_check  # lazy: only crates with heuristics need it at load

        fam: Any
        for fam in kernels:
            t = fam.entry.triton
            if t.heuristics:
                fam.heuristic_check = heuristic_check(fam, _host(kernels, t.module, t.qualname or t.kernel))

    def function(self, kernels: CrateKernels, name: str) -> Any:
        """The kernel's own call (:class:`~khal_runtime.triton_call.TritonFunction`, made now), None
        when the crate has no variant of a kernel of that name recording its signature."""
        entries = _function_entries(kernels).get(name)
        if entries is None:
            return None
        from khal_runtime.triton_call import TritonFunction  # lazy: no Triton call is made at load

        f = TritonFunction(kernels, name, entries)
        f._host = _host(kernels, f.module, f.qualname or name)
        return f

    def function_names(self, kernels: CrateKernels) -> list[str]:
        return sorted(_function_entries(kernels))

    def serves(self, crate: Crate) -> bool:
        if crate.triton is not None and crate.triton.serves is not None:
            return True
        return any(e.triton is not None and e.triton.module for e in crate.entries)


def _function_entries(kernels: CrateKernels) -> dict[str, list[Kernel]]:
    """The crate's entries by kernel, those recording its signature (grouped once)."""
    d = kernels.__dict__
    out: dict[str, list[Kernel]] | None = d.get("_triton_functions")
    if out is None:
        from khal_runtime.triton_call import group_functions  # lazy: no Triton call is made at load

        out = d["_triton_functions"] = group_functions(kernels.instances.values())
    return out


def _host(kernels: CrateKernels, module: str | None, qualname: str) -> Host:
    """The kernel's host object record (shared by its TritonFunction and instance families)."""
    from khal_runtime.triton_host import Host  # lazy: only crates with heuristics or own calls need it

    hosts: dict[tuple[str | None, str], Host] = kernels.__dict__.setdefault("_hosts", {})
    h = hosts.get((module, qualname))
    if h is None:
        h = hosts[(module, qualname)] = Host(module, qualname)
    return h


TRITON = TritonLanguage("triton", "Triton")
