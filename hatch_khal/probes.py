"""A CUDA C++ crate's manifest entries, from its scanned markers and one of its binaries.

What the scanner read (:mod:`hatch_khal.entries`) says how each parameter is *spelled*; the
binary says what the compiler made of it. The generated code (:mod:`hatch_khal.codegen`)
compiles, per parameter, three probe globals: ``khal_sizeof_<e>_<i>``, ``khal_alignof_<e>_<i>``
and ``khal_typeid_<e>_<i>`` (``khal::type_id``: kind and size). So a ``typedef float real_t``,
a ``TYPE_NAME`` from ``defines``, ``long``, ``unsigned int`` or a template parameter becomes the
ABI scalar it is (and the runtime checks arrays against that dtype), a class becomes a struct
element of its exact size, and ``cuda::std::complex<float>`` (or ``thrust::complex``) becomes
``complex64``.

The entry's indirect (persistent-grid) variant is kept only when nothing it runs reads the
real ``blockIdx`` / ``gridDim``: the body's own reads are remapped (khal.h passes them as
parameters), but a helper function or a CUDA header reading them would see the persistent
grid, silently. The PTX tells (:func:`khal_runtime.binaries.ptx_grid_reads`, inline asm included);
a build with no PTX falls back on the sources' text (:attr:`hatch_khal.entries.EntryDecl.grid_reads_elsewhere`).
The build decides this before the binaries it ships (:meth:`hatch_khal.cuda.CudaLanguage.prepare`),
so a variant judged wrong is in none of them. An entry without the variant has ``indirect_symbol``
None and ``indirect_reason`` saying why.

The launch facts (:func:`launch_facts`, manifest ``launch``) come from the same PTX: the grid axes
the direct kernel's code reads, and whether the ids it uses fold the compiled block in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from khal_runtime import abi, launch_attributes
from khal_runtime.abi import indirect_symbol_for, symbol_for
from khal_runtime.binaries import FOLD_TAGGED_GLOBAL, BinaryInfo, KernelReads, ptx_grid_reads, ptx_kernel_reads
from khal_runtime.manifest import Entry, LaunchAttributes, LaunchFacts, Param
from khal_runtime.verify import facts_from_reads

from hatch_khal.codegen import TYPE_PROBE_BIAS, has_indirect, probe_names, type_probe_name
from hatch_khal.entries import EntryDecl, ParamDecl
from hatch_khal.errors import KhalBuildError

__all__ = ["SCALAR_LOOKING", "demangle", "indirect_verdict", "launch_facts", "manifest_entries"]

#: Spellings that read like a scalar: a struct called so is reported (the build says so,
#: since a ``struct half`` of one's own is not CUDA's ``__half``)
SCALAR_LOOKING = re.compile(
    r"(?:u?int(?:8|16|32|64)?(?:_t)?|float(?:16|32|64)?(?:_t)?|double(?:_t)?|b?float16(?:_t)?|half\d*|"
    r"bfloat16|real(?:_t)?|scalar(?:_t)?|index(?:_t)?|s?size_t|ptrdiff_t|c?complex(?:64|128)?(?:_t)?|"
    r"cfloat|cdouble|[iu]\d+|f\d+)", re.I)  # matched whole (fullmatch)


def demangle(name: str) -> str:
    """``_Z6helperv`` -> ``helper``; ``_ZN2ns6helperEv`` -> ``ns::helper`` (enough for
    messages; anything else is returned as it is)."""
    if not name.startswith("_Z"):
        return name
    i = 3 if name.startswith("_ZN") else 2
    parts: list[str] = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        k = int(name[i:j])
        parts.append(name[j : j + k])
        i = j + k
        if not name.startswith("_ZN"):
            break
    return "::".join(parts) if parts else name


def _element(crate: str, decl: EntryDecl, i: int, p: ParamDecl, probes: dict[str, int],
             warnings: list[str]) -> tuple[str, int, int]:
    """(element type, size, alignment) of parameter ``i`` as the compiler has it."""
    size_name, align_name = probe_names(decl.name, i)
    type_name = type_probe_name(decl.name, i)
    what = f"{decl.where}: crate {crate!r}: entry {decl.name!r} parameter {p.name!r}"
    if size_name not in probes or type_name not in probes:
        raise KhalBuildError(
            f"crate {crate!r}: entry {decl.name!r}: the binary lacks the probe "
            f"{size_name if size_name not in probes else type_name}; was it built by this hatch-khal from "
            "these sources?"
        )
    size, align, tid = probes[size_name], probes.get(align_name, 1), probes[type_name] - TYPE_PROBE_BIAS
    spelled = decl.spelled(p.ctype)
    scalar = abi.type_id_scalar(tid)
    if scalar is not None:
        if scalar.size != size:
            raise KhalBuildError(f"{what}: {spelled} is {size} bytes on the device, but its type probe says "
                                 f"{scalar.name}")
        return scalar.name, size, align
    if tid != 0:
        raise KhalBuildError(
            f"{what}: type {spelled!r} is {abi.describe_type_id(tid)} on the device, which the ABI has no scalar "
            f"for (it has {', '.join(abi.SCALARS)}); use one of those"
        )
    kind = abi.kind(p.kind)
    if kind.strategy.name == "value":  # passed by value: only a scalar of the ABI
        structs = " or ".join(m.macro for k, m in abi.markers().values() if k.strategy.name == "struct")
        raise KhalBuildError(
            f"{what}: {kind.marker(p.shape).macro} type {spelled!r} is a struct ({size} bytes) on the device; "
            f"a scalar is one of the ABI's ({', '.join(abi.SCALARS)}): pass structs as {structs}"
        )
    base = re.sub(r"<.*", "", spelled).split("::")[-1]
    if base in abi.C_SCALARS or base in abi.SCALARS or SCALAR_LOOKING.fullmatch(base):
        warnings.append(
            f"{what}: {spelled!r} is a struct ({size} bytes) on the device, not a scalar: recorded as a struct "
            "element, so arrays of it must have a structured (or raw void) dtype of that size"
            + (f"; include the header that defines the CUDA type {base!r} if you meant it"
               if base in abi.C_SCALARS else "")
        )
    if spelled in abi.SCALARS:  # a struct of one's own called "float32" is not the scalar
        spelled = f"struct {spelled}"
    return spelled, size, align


def indirect_verdict(crate: str, decl: EntryDecl, h: str, reads: dict[str, tuple[tuple[str, str], ...]] | None
                     ) -> tuple[str | None, str | None]:
    """(indirect symbol, None) or (None, why the entry has no indirect variant), from the grid
    reads of a PTX of the crate compiled with the variant (None: no PTX, the sources' text)."""
    if not has_indirect(decl):
        what = launch_attributes.indirect_blocker(decl.attributes)
        if what is not None:
            return None, (f"it is {what}: a persistent grid's loop would run a different number of groups per "
                          "block, and a grid / cluster sync inside it would deadlock")
        return None, f"it is a {decl.grid_dims}-D entry, and indirect dispatch counts groups along x only"
    sym = indirect_symbol_for(decl.name, h)
    if reads is not None:
        if sym not in reads:
            raise KhalBuildError(f"crate {crate!r}: the PTX has no kernel {sym} for entry {decl.name!r}")
        found = reads[sym]
        if not found:
            return sym, None
        regs = sorted({r for r, _ in found})
        where = sorted({"its kernel (inlined code)" if f == sym else demangle(f) for _, f in found})
        cuda = {"ctaid": "blockIdx", "nctaid": "gridDim"}
        names = ", ".join(f"{cuda.get(r.split('.')[0], r)}{'.' + r.split('.')[1] if '.' in r else ''}"
                          for r in regs)
        return None, (
            f"code it runs reads {names} outside the entry body (in {', '.join(where)}): a helper function or "
            "a header that reads the real blockIdx / gridDim would see the persistent grid, so the build left "
            "the variant out (pass the values from the body, whose blockIdx / gridDim are remapped, or use "
            "KHAL_GROUP_ID / KHAL_NUM_GROUPS)"
        )
    if decl.grid_reads_elsewhere:
        shown = ", ".join(decl.grid_reads_elsewhere[:5]) + (" ..." if len(decl.grid_reads_elsewhere) > 5 else "")
        return None, (
            f"the crate reads blockIdx / gridDim outside entry bodies ({shown}), and a build without PTX "
            "(ptx-arch = \"none\") cannot check whether this entry's code reaches those reads (build PTX too)"
        )
    return sym, None


def launch_facts(decl: EntryDecl, symbol: str, kernels: dict[str, KernelReads] | None, tagged: bool) -> LaunchFacts:
    """What the compiled kernel ``symbol`` does with the launch geometry, from the PTX's reads
    (``kernels``; None: no PTX, the scanned facts). ``tagged``: the PTX carries the hook's
    ``khal:fold`` tags (:data:`khal_runtime.binaries.FOLD_TAGGED_GLOBAL`); untagged ids count as
    folding the block."""
    if kernels is None:
        return LaunchFacts(source="scan", grid_axes=decl.grid_dims, block_fixed=decl.fixed_block)
    return facts_from_reads(kernels[symbol], decl.fixed_block, tagged)


def manifest_entries(crate: str, decls: Sequence[tuple[EntryDecl, str]], binary: BinaryInfo,
                     without_indirect: Mapping[str, str] | None = None, trust_ptx: bool = True,
                     ) -> tuple[tuple[Entry, ...], list[str]]:
    """The manifest entries of a CUDA C++ crate (each decl with its entry hash), their types
    from ``binary``'s probes (its PTX, when it is one, also for the indirect check and the launch
    facts), and the warnings the build should show. ``without_indirect``: entries whose variant
    the build left out of the binaries, with why; ``trust_ptx`` False (a debug build, whose PTX
    keeps dead reads): the launch facts are the scanned ones."""
    probes = dict(binary.globals_u64)
    ptx = binary.text if binary.kind == "ptx" and binary.text is not None else None
    reads = ptx_grid_reads(ptx) if ptx is not None else None
    kernels = ptx_kernel_reads(ptx) if ptx is not None and trust_ptx else None
    tagged = FOLD_TAGGED_GLOBAL in probes
    dropped = without_indirect or {}
    warnings: list[str] = []
    entries = []
    for decl, h in decls:
        params = []
        for i, p in enumerate(decl.params):
            element_type, size, align = _element(crate, decl, i, p, probes, warnings)
            params.append(Param(name=p.name, kind=p.kind, element_type=element_type, element_size=size,
                                element_align=align, shape=p.shape,  # type: ignore[arg-type]
                                length=p.length, writable=p.writable, ctype=p.ctype))
        indirect: str | None
        reason: str | None
        if decl.name in dropped:
            indirect, reason = None, dropped[decl.name]
        else:
            indirect, reason = indirect_verdict(crate, decl, h, reads)
        entries.append(Entry(
            name=decl.name,
            symbol=symbol_for(decl.name, h),
            hash=h,
            block_size=decl.block,
            params=tuple(params),
            indirect_symbol=indirect,
            indirect_reason=reason,
            grid_dims=decl.grid_dims,
            fixed_block=decl.fixed_block,
            launch_bounds=decl.launch_bounds,
            template=decl.template,
            template_args=decl.template_args if decl.template is not None else None,
            launch=launch_facts(decl, symbol_for(decl.name, h), kernels, tagged),
            attributes=LaunchAttributes(**decl.attributes) if decl.attributes else None,
        ))
    return tuple(entries), warnings
