"""Generating a crate's translation unit: its sources, then one kernel per entry.

For every entry ``e`` the hook emits

* ``e_khal_<hash>``: the direct kernel, one thread per invocation;
* ``e_indirect_khal_<hash>`` (1-D entries): the same body in a persistent-grid loop over a
  group count read from device memory (``const uint32_t*``, appended as the last
  parameter), so an indirect dispatch needs no host read. The body's ``blockIdx`` and
  ``gridDim`` are parameters of the entry function (khal.h), which this loop sets to the
  group it runs; whether anything else the kernel calls still reads the real ones is
  checked in the binary (:mod:`hatch_khal.probes`), and the variant is left out of the
  manifest if so;
  (the loop's own reads of the grid are inline asm tagged ``khal:loop``; the variant is generated
  only for the entries the build has not judged wrong, :meth:`hatch_khal.cuda.CudaLanguage.prepare`);
* the ids of a fixed block fold it in through tiny non-volatile asm tagged ``khal:fold.<axis>``,
  which the compiler deletes where the id is unused: the PTX then says whether the code that runs
  uses such an id (:func:`khal_runtime.binaries.ptx_kernel_reads`); ``khal_fold_tagged`` marks a
  unit whose ids carry the tags;
* ``khal_sizeof_<e>_<i>`` / ``khal_alignof_<e>_<i>`` / ``khal_typeid_<e>_<i>`` globals: the
  compiler's own size, alignment and kind (``khal::type_id``) of each parameter's element
  type, read back from the binary so the host never guesses what a type is.

The kernels take their parameter types from the entry function's own type
(``khal::entry_sig``), so typedefs, macros and template parameters are the compiler's to
resolve. Every generated line is preceded by ``#line <marker line> "<file>"``, so a compile
error in generated code names the author's marker.

Before the sources it declares ``khal_scanned_entry_<e>`` for every entry (and template) the
scanner found: ``KHAL_ENTRY`` / ``KHAL_INSTANTIATE`` (khal.h) check their entry is among them,
so a marker the scanner could not read (one made by a macro) fails the compile at its own
file:line (:data:`UNSCANNED_RE`), as does a scanned entry the preprocessor left out
(:data:`NOT_COMPILED_RE`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from khal_runtime import abi, launch_attributes
from khal_runtime.abi import indirect_symbol_for, symbol_for
from khal_runtime.binaries import FOLD_TAGGED_GLOBAL

from hatch_khal.entries import EntryDecl
from hatch_khal.errors import EntryParseError

__all__ = ["NOT_COMPILED_RE", "UNSCANNED_RE", "GeneratedUnit", "explain_entry_error", "generate_unit", "has_indirect", "probe_names",
           "type_probe_name", "TYPE_PROBE_BIAS"]

#: NVRTC's error for a KHAL_ENTRY the scanner did not see (file, line, entry name).
UNSCANNED_RE = re.compile(
    r'^(?P<file>.+?)\((?P<line>\d+)\): error: identifier "khal_scanned_entry_(?P<name>\w+)" is undefined', re.M
)
#: NVRTC's error for a scanned entry whose function was not compiled (inside ``#if 0``, ...).
NOT_COMPILED_RE = re.compile(r'error: identifier "khal_entry_(?P<name>\w+)" is undefined')


#: added to every type probe (:data:`khal_runtime.abi.TYPE_PROBE_BIAS`)
TYPE_PROBE_BIAS = abi.TYPE_PROBE_BIAS


def probe_names(entry: str, index: int) -> tuple[str, str]:
    return abi.probe_names(entry, index)[:2]


def type_probe_name(entry: str, index: int) -> str:
    return abi.probe_names(entry, index)[2]


@dataclass(frozen=True)
class GeneratedUnit:
    #: Full translation unit given to NVRTC (includes sources by absolute path).
    text: str
    #: The generated part alone (no absolute paths): part of the cache key.
    generated: str


def _kernel_params(entry: EntryDecl, sig: str) -> list[str]:
    out: list[str] = []
    for i, p in enumerate(entry.params):
        out += abi.kind(p.kind).cuda_params(f"{sig}::arg<{i}>", f"khal_p{i}", p.restrict)
    return out


def _call_args(entry: EntryDecl, sig: str) -> list[str]:
    return [abi.kind(p.kind).marker(p.shape).call_arg(f"{sig}::arg<{i}>", f"khal_p{i}")
            for i, p in enumerate(entry.params)]


def marker_defines() -> list[str]:
    """The parameter markers' ``#define`` lines, from :data:`khal_runtime.abi.KINDS`: the
    generated unit defines them before ``khal.h`` (which defines its copies only outside the
    hook), so a new kind needs no edit of the header."""
    return [m.define() for _, m in abi.markers().values()]


def _callee(entry: EntryDecl) -> str:
    f = f"khal_entry_{entry.function}"
    return f"{f}<{', '.join(entry.template_args)}>" if entry.template is not None else f


def _launch_bounds(entry: EntryDecl) -> str:
    """``__launch_bounds__`` of the generated kernels, and ``__cluster_dims__`` of a clustered entry
    (``KHAL_CLUSTER``: compiled in, so the driver launches it in clusters with no attribute)."""
    cluster = launch_attributes.CLUSTER_DIMS.of(entry.attributes)
    cd = " __cluster_dims__({}, {}, {})".format(*cluster) if cluster else ""
    if entry.fixed_block:
        return f" __launch_bounds__({entry.threads}){cd}"
    return (f" __launch_bounds__({entry.launch_bounds})" if entry.launch_bounds else "") + cd


def _fold(axis: str, block: int, target: str, group: str, wide: bool = True) -> list[str]:
    """``target = group * block`` through a tiny non-volatile asm tagged ``khal:fold.<axis>``: the
    compiler deletes it where the id is unused, so its presence in the PTX that a kernel reaches
    says the ids it uses fold the compiled block in (:func:`khal_runtime.binaries.ptx_kernel_reads`)."""
    if wide:  # a 32-bit block id, widened to the 64-bit id
        return [f'asm("mul.wide.u32 %0, %1, %2; // khal:fold.{axis}" : "=l"({target}) : "r"({group}), "n"({block}));']
    return [f'asm("mul.lo.u64 %0, %1, %2; // khal:fold.{axis}" : "=l"({target}) : "l"({group}), "n"({block}));']


def _entry_code(entry: EntryDecl, entry_hash: str, indirect: bool = True) -> str:
    sig = f"khal_sig_{entry.name}"
    params = _kernel_params(entry, sig)
    args = ", ".join(_call_args(entry, sig))
    callee = _callee(entry)
    bx, by, bz = entry.block
    lb = _launch_bounds(entry)
    lines = [f"// entry {entry.name} ({entry.file}:{entry.line})",
             f"typedef ::khal::entry_sig<decltype(&{callee})> {sig};"]
    for i, _ in enumerate(entry.params):
        size_name, align_name = probe_names(entry.name, i)
        t = f"::khal::value_t<{sig}::arg<{i}> >"
        lines.append(f'extern "C" __device__ const unsigned long long {size_name} = sizeof({t});')
        lines.append(f'extern "C" __device__ const unsigned long long {align_name} = alignof({t});')
        lines.append(f'extern "C" __device__ const unsigned long long {type_probe_name(entry.name, i)} = '
                     f"{TYPE_PROBE_BIAS}ull | ::khal::type_id<{t}>::value;")
    if entry.fixed_block:
        # the ids fold the compiled block in, through tagged asm (_fold): the build tells from the
        # PTX whether the code that runs uses them (if not, any block within the bounds is right)
        ids = ["    unsigned long long khal_fx, khal_fy, khal_fz;",
               *("    " + ln for ln in _fold("x", bx, "khal_fx", "blockIdx.x")),
               *("    " + ln for ln in _fold("y", by, "khal_fy", "blockIdx.y")),
               *("    " + ln for ln in _fold("z", bz, "khal_fz", "blockIdx.z")),
               "    khal_inv.global_id = khal_fx + threadIdx.x;",
               "    khal_inv.global_id_y = khal_fy + threadIdx.y;",
               "    khal_inv.global_id_z = khal_fz + threadIdx.z;"]
    else:
        ids = ["    khal_inv.global_id = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;",
               "    khal_inv.global_id_y = (unsigned long long)blockIdx.y * blockDim.y + threadIdx.y;",
               "    khal_inv.global_id_z = (unsigned long long)blockIdx.z * blockDim.z + threadIdx.z;"]
    lines += [
        f'extern "C" __global__ void{lb} {symbol_for(entry.name, entry_hash)}(',
        "    " + ",\n    ".join(params) + ")",
        "{",
        "    ::khal::Invocation khal_inv;",
        "    khal_inv.local_id = threadIdx.x; khal_inv.local_id_y = threadIdx.y; khal_inv.local_id_z = threadIdx.z;",
        "    khal_inv.group_id = blockIdx.x; khal_inv.group_id_y = blockIdx.y; khal_inv.group_id_z = blockIdx.z;",
        "    khal_inv.num_groups = gridDim.x; khal_inv.num_groups_y = gridDim.y; khal_inv.num_groups_z = gridDim.z;",
        *ids,
        f"    {callee}(khal_inv, blockIdx, gridDim{', ' if args else ''}{args});",
        "}",
    ]
    if indirect and has_indirect(entry):
        if entry.fixed_block:
            gid = ["        unsigned long long khal_fx;",
                   *("        " + ln for ln in _fold("x", bx, "khal_fx", "g", wide=False)),
                   "        khal_inv.global_id = khal_fx + threadIdx.x;"]
        else:
            gid = ["        khal_inv.global_id = g * blockDim.x + threadIdx.x;"]
        lines += [
            f'extern "C" __global__ void{lb} {indirect_symbol_for(entry.name, entry_hash)}(',
            "    " + ",\n    ".join(params + ["const unsigned int* khal_group_count"]) + ")",
            "{",
            "    // the loop's own reads of the grid are inline asm tagged khal:loop: the build tells them",
            "    // apart from reads the body makes of the real blockIdx / gridDim (hatch_khal/probes.py)",
            "    unsigned khal_block, khal_grid;",
            '    asm("mov.u32 %0, %%ctaid.x; // khal:loop" : "=r"(khal_block));',
            '    asm("mov.u32 %0, %%nctaid.x; // khal:loop" : "=r"(khal_grid));',
            "    const unsigned long long khal_groups = *khal_group_count;",
            "    for (unsigned long long g = khal_block; g < khal_groups; g += khal_grid) {",
            "        ::khal::Invocation khal_inv;",
            "        khal_inv.local_id = threadIdx.x; khal_inv.local_id_y = threadIdx.y; "
            "khal_inv.local_id_z = threadIdx.z;",
            "        khal_inv.group_id = g; khal_inv.group_id_y = 0; khal_inv.group_id_z = 0;",
            "        khal_inv.num_groups = khal_groups; khal_inv.num_groups_y = 1; khal_inv.num_groups_z = 1;",
            *gid,
            "        khal_inv.global_id_y = threadIdx.y; khal_inv.global_id_z = threadIdx.z;",
            "        uint3 khal_bid; khal_bid.x = (unsigned)g; khal_bid.y = 0u; khal_bid.z = 0u;",
            "        dim3 khal_gdim((unsigned)khal_groups, 1u, 1u);",
            f"        {callee}(khal_inv, khal_bid, khal_gdim{', ' if args else ''}{args});",
            "        __syncthreads();  // the next group may reuse the block's shared memory",
            "    }",
            "}",
        ]
    where = f'#line {entry.line} "{entry.file}"'
    return "".join(f"{where}\n{ln}\n" for ln in lines)


def has_indirect(entry: EntryDecl) -> bool:
    """Whether the entry gets a persistent-grid variant: 1-D entries (the device-side count
    is one number of groups along x), without a launch attribute that rules it out (cooperative,
    clustered: a grid or cluster sync in a loop whose trip count differs between blocks would
    deadlock; ``LaunchAttribute.no_indirect``)."""
    return entry.grid_dims == 1 and launch_attributes.indirect_blocker(entry.attributes) is None


#: what ``khal::type_id`` says of the CUDA half types, when the sources included them
_HALF_TYPE_IDS = f"""
#ifdef __CUDA_FP16_TYPES_EXIST__
namespace khal {{ template <> struct type_id_<__half, void> {{ enum : u64 {{ value = {abi.type_id(abi.SCALARS["float16"])} }}; }}; }}
#endif
#ifdef __CUDA_BF16_TYPES_EXIST__
namespace khal {{ template <> struct type_id_<__nv_bfloat16, void> {{ enum : u64 {{ value = {abi.type_id(abi.SCALARS["bfloat16"])} }}; }}; }}
#endif
"""


def explain_entry_error(log: str, decls: list[EntryDecl], display: Callable[[str], str],
                        crate: str) -> EntryParseError | None:
    """The error to report when NVRTC's ``log`` shows a marker the scanner did not read (made by
    a macro) or an entry it read that the compiler left out; None otherwise."""
    m = UNSCANNED_RE.search(log)
    if m is not None:
        where = f"{display(m.group('file'))}:{m.group('line')}"
        return EntryParseError(
            f"{where}: crate {crate!r}: entry {m.group('name')!r}: this KHAL_ENTRY / KHAL_INSTANTIATE was not "
            "read by hatch-khal: the marker is made by a macro (or sits in a file that is not a source and is "
            "not #included literally); write 'KHAL_ENTRY(' / 'KHAL_INSTANTIATE(' literally in the source, not "
            "through a macro"
        )
    m = NOT_COMPILED_RE.search(log)
    if m is not None:
        decl = next((d for d in decls if d.function == m.group("name")), None)
        if decl is not None:
            what = f"template entry {decl.template!r}" if decl.template else f"entry {decl.name!r}"
            conds = "; ".join(str(c) for c in decl.conds)
            why = (f"it sits under {conds}, which hatch-khal could not decide and the compiler turned off"
                   if conds else "is it inside an #if / #ifdef that is off, or in a header included under one?")
            return EntryParseError(
                f"{decl.file}:{decl.line}: crate {crate!r}: {what} was found by hatch-khal but not compiled ({why}); "
                "hatch-khal decides #if conditions from literals, the crate's 'defines' and the file's own "
                "#defines only: remove the marker, make the condition one of those, or keep it outside the #if"
            )
    return None


def generate_unit(crate: str, sources: list[Path], entries: Sequence[tuple[EntryDecl, str]],
                  without_indirect: frozenset[str] = frozenset()) -> GeneratedUnit:
    """The crate's translation unit: khal.h, each source, then the generated kernels (no indirect
    variant for the entries named in ``without_indirect``: those the build judged wrong)."""
    kernels = ('#line 1 "<hatch-khal generated>"\n' + _HALF_TYPE_IDS +
               f'extern "C" __device__ const unsigned long long {FOLD_TAGGED_GLOBAL} = 1;\n' +
               "".join(_entry_code(e, h, e.name not in without_indirect) for e, h in entries))
    head = [f"// Generated by hatch-khal for crate {crate!r}. Do not edit.", "#define KHAL_SCANNED 1"]
    scanned = sorted({e.name for e, _ in entries} | {e.template for e, _ in entries if e.template is not None})
    head += [f"constexpr bool khal_scanned_entry_{n} = true;" for n in scanned]
    if any(p.restrict for e, _ in entries for p in e.params):
        # KHAL_STORAGE(const float __restrict__, x): restrict qualifies the kernel's pointer
        # parameter (spelled __restrict there), not an element type, where C++ refuses it
        head += ["#define __restrict__"]
    head += ["// parameter markers (khal_runtime.abi.KINDS)", *marker_defines(), '#include "khal.h"']
    includes = [f'#include "{p.as_posix()}"' for p in sources]
    text = "\n".join(head + includes) + "\n\n" + kernels
    return GeneratedUnit(text=text, generated="\n".join(head) + "\n" + kernels)
