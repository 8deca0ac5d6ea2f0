"""A Triton crate's attributes in the package's typed ``kernels`` stub (:mod:`hatch_khal.stubs`
asks the crate's language, :meth:`TritonLanguage.stub_members`): its instance families, each a
``TritonKernel`` (its ``__base`` twins are not attributes), and each kernel's own call, a
``TritonFunction``, where no family has its name."""

from __future__ import annotations

from khal_runtime.manifest import Crate

from hatch_khal.languages import StubMember

__all__ = ["STUB_IMPORTS", "stub_members"]

#: the types the members name
STUB_IMPORTS = (("khal_runtime.triton", "TritonKernel"), ("khal_runtime.triton_call", "TritonFunction"))


def stub_members(c: Crate) -> list[StubMember]:
    """Crate ``c``'s attributes, in entry order: one per family (an autotuned family has an entry per
    config), then each kernel's own call whose name no family takes."""
    families: list[str] = []
    for e in c.entries:
        if e.triton is not None and not e.triton.base and e.triton.family not in families:
            families.append(e.triton.family)
    out = [StubMember(f, "TritonKernel", tuple(_triton_doc(c, f))) for f in families]
    out += [StubMember(fn, "TritonFunction", tuple(_function_doc(c, fn)), item=False)
            for fn in _triton_functions(c) if fn not in families]
    return out


def _triton_doc(c: Crate, family: str) -> list[str]:
    """The attribute docstring of Triton family ``family`` of crate ``c``: how it is called, and each
    variant the runtime may choose, with its hash (what a stale binary is checked against)."""
    variants = [(e, e.triton) for e in c.entries if e.triton is not None and e.triton.family == family]
    first, t = next((e, t) for e, t in variants if not t.base)
    args = ", ".join(f"{n}: {ty}" for n, ty in zip(t.names, t.types))
    out = [f"Triton kernel ``{t.kernel}``: ``{family}`` of crate ``{c.name}`` (hash ``{first.hash}``).", "",
           f"``k[grid]({args}, stream=None)``; grid in programs."]
    if t.config is not None:
        out.append(f"Autotuned: one variant per config of its @triton.autotune, chosen per value of "
                   f"({', '.join(t.autotune_key)}) " + ("by timing on first use." if t.choose is None else
                                                         f"by the crate's rule: config {t.choose}."))
    for e, v in variants:
        if e is not first:
            when = "when a call breaks an assumption" if v.base else f"config {v.config}"
            out.append(f"``{e.name}`` of crate ``{c.name}`` (hash ``{e.hash}``): {when}.")
    return out


def _triton_functions(c: Crate) -> list[str]:
    """The kernels of Triton crate ``c`` that have their own call (entries recording the kernel's
    signature, as :func:`khal_runtime.triton_call.group_functions` groups them), in entry order."""
    out: list[str] = []
    for e in c.entries:
        t = e.triton
        if t is not None and t.params:
            name = t.qualname or t.kernel
            if name not in out:
                out.append(name)
    return out


def _function_doc(c: Crate, name: str) -> list[str]:
    """The attribute docstring of kernel ``name``'s own call in crate ``c``."""
    variants = [e for e in c.entries if e.triton is not None and (e.triton.qualname or e.triton.kernel) == name]
    t = variants[0].triton
    assert t is not None
    params = ", ".join(p.name for p in t.params)
    where = f" (served as ``{t.module}.{name}``)" if t.module else ""
    return [f"Triton kernel ``{name}`` of crate ``{c.name}``: its own call over {len(variants)} variant(s){where}.",
            "", f"``k[grid]({params}, num_warps=..., num_stages=..., stream=None)``, as Triton's JIT takes it."]
