"""A Triton entry in ``python -m hatch_khal inspect`` (:meth:`TritonLanguage.inspect_entry`): its
kernel, its specialisation as a call of the kernel (each argument's type and assumption as the lock
file spells them, each constexpr's value) and its options."""

from __future__ import annotations

import json

from khal_runtime.manifest import ConstValue, Entry, TritonDtype, TritonFacts

__all__ = ["inspect_entry"]


def inspect_entry(e: Entry) -> tuple[str | None, list[str]]:
    """(the kernel the entry is a variant of, its specialisation and options), or (None, [])."""
    tri = e.triton
    if tri is None:
        return None, []
    return tri.kernel, _triton_lines(e.name, tri)


def _const(value: ConstValue) -> str:
    """A constexpr's value as the lock file spells it (TOML: ``1024``, ``true``, ``"mean"``,
    ``{ dtype = "fp32" }``, ``{ none = true }``)."""
    if isinstance(value, TritonDtype):
        return f"{{ dtype = {json.dumps(value.dtype)} }}"
    if value is None:
        return "{ none = true }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value) if isinstance(value, float) else str(value)


def _triton_lines(entry: str, tri: TritonFacts) -> list[str]:
    """A Triton entry's specialisation as a call of its kernel (each argument's type and assumption
    as the lock file spells it: ``*fp32:16``, ``i32:1``, ``none``; each constexpr's value), and its
    options."""
    div, ones, nones = set(tri.divisible), set(tri.ones), set(tri.nones)
    types = dict(zip(tri.names, tri.types))

    def arg(name: str) -> str:
        if name in nones:
            return f"{name}: none"
        return f"{name}: {types[name]}" + (":16" if name in div else "") + (":1" if name in ones else "")

    shown: list[str] = []
    done: set[str] = set()
    for p in tri.params:  # the kernel's whole signature, in order (manifests before it: none)
        if p.name in tri.constexprs:
            shown.append(f"{p.name} = {_const(tri.constexprs[p.name])}")
        elif p.name in types or p.name in nones:
            shown.append(arg(p.name))
        else:
            continue
        done.add(p.name)
    shown += [arg(n) for n in tri.names if n not in done]
    shown += [arg(n) for n in tri.nones if n not in done and n not in types]
    shown += [f"{k} = {_const(v)}" for k, v in tri.constexprs.items() if k not in done]
    opts = [f"num_warps = {tri.num_warps}", f"num_stages = {tri.num_stages}"]
    if tri.ctas != 1:
        opts.append(f"num_ctas = {tri.ctas}")
    if tri.maxnreg is not None:
        opts.append(f"maxnreg = {tri.maxnreg}")
    notes = [f"{tri.shared} B shared"]
    if tri.config is not None:  # an autotuned family's variant: its config and how it is chosen
        notes.append(f"autotune config {tri.config} (key {', '.join(tri.autotune_key)}; "
                     + ("timed at first use)" if tri.choose is None else f"rule: config {tri.choose})"))
    if tri.heuristics:
        notes.append(f"heuristics {', '.join(tri.heuristics)}")
    if tri.base:
        notes.append(f"the conservative twin of {tri.family}")
    elif tri.family != entry:  # an autotuned config's variant (its family launches it)
        notes.append(f"family {tri.family}")
    if tri.recorded:
        notes.append("recorded (lock file)")
    if tri.module is not None:
        notes.append(f"importable as {tri.module}:{tri.qualname or tri.kernel}")
    return [f"      triton {tri.kernel}({', '.join(shown)})", f"      {', '.join(opts)}; {'; '.join(notes)}"]
