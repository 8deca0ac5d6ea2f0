"""Generating a crate's translation unit: its sources, then one kernel per entry.

For every entry ``e`` the hook emits

* ``e_khal_<hash>``: the direct kernel, one thread per invocation;
* ``e_indirect_khal_<hash>``: the same body in a persistent-grid loop over a
  group count read from device memory (``const uint32_t*``, appended as the last
  parameter), so an indirect dispatch needs no host read;
* ``khal_sizeof_<e>_<i>`` / ``khal_alignof_<e>_<i>`` globals: the compiler's own
  sizes of each parameter's element type, read back from the PTX so the host
  never guesses a struct size.

Before the sources it declares ``khal_scanned_entry_<e>`` for every entry the scanner
found: ``KHAL_ENTRY`` (khal.h) asserts its entry is among them, so a marker the scanner
could not read (one made by a macro) fails the compile at its own file:line
(:data:`UNSCANNED_RE`), as does a scanned entry the preprocessor left out
(:data:`NOT_COMPILED_RE`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from khal_runtime.abi import indirect_symbol_for, symbol_for

from hatch_khal.entries import EntryDecl, ParamDecl

__all__ = ["NOT_COMPILED_RE", "UNSCANNED_RE", "GeneratedUnit", "generate_unit", "probe_names"]

#: NVRTC's error for a KHAL_ENTRY the scanner did not see (file, line, entry name).
UNSCANNED_RE = re.compile(
    r'^(?P<file>.+?)\((?P<line>\d+)\): error: identifier "khal_scanned_entry_(?P<name>\w+)" is undefined', re.M
)
#: NVRTC's error for a scanned entry whose function was not compiled (inside ``#if 0``, ...).
NOT_COMPILED_RE = re.compile(r'error: identifier "khal_entry_(?P<name>\w+)" is undefined')


def probe_names(entry: str, index: int) -> tuple[str, str]:
    return f"khal_sizeof_{entry}_{index}", f"khal_alignof_{entry}_{index}"


@dataclass(frozen=True)
class GeneratedUnit:
    #: Full translation unit given to NVRTC (includes sources by absolute path).
    text: str
    #: The generated part alone (no paths): part of the cache key.
    generated: str


def _ctype(p: ParamDecl) -> str:
    return f"const {p.ctype}" if p.const else p.ctype


def _kernel_params(entry: EntryDecl) -> list[str]:
    out: list[str] = []
    for i, p in enumerate(entry.params):
        if p.kind == "storage":
            out += [f"{_ctype(p)}* khal_p{i}_ptr", f"unsigned long long khal_p{i}_len"]
        elif p.kind == "uniform":
            out.append(f"const {p.ctype}* khal_p{i}_ptr")
        else:
            out.append(f"{p.ctype} khal_p{i}")
    return out


def _call_args(entry: EntryDecl) -> list[str]:
    out: list[str] = []
    for i, p in enumerate(entry.params):
        t = _ctype(p)
        if p.kind == "storage" and p.shape == "slice":
            out.append(f"::khal::Storage<{t}>{{khal_p{i}_ptr, khal_p{i}_len}}")
        elif p.kind == "storage" and p.shape == "array":
            out.append(f"*reinterpret_cast<{t}(*)[{p.length}]>(khal_p{i}_ptr)")
        elif p.kind in ("storage", "uniform"):
            out.append(f"*khal_p{i}_ptr")
        else:
            out.append(f"khal_p{i}")
    return out


def _entry_code(entry: EntryDecl, entry_hash: str) -> str:
    params = _kernel_params(entry)
    args = ", ".join(["khal_inv"] + _call_args(entry))
    b = entry.block_size
    lines = [f"// entry {entry.name} ({entry.file}:{entry.line})"]
    for i, p in enumerate(entry.params):
        size_name, align_name = probe_names(entry.name, i)
        lines.append(f'extern "C" __device__ const unsigned long long {size_name} = sizeof({p.ctype});')
        lines.append(f'extern "C" __device__ const unsigned long long {align_name} = alignof({p.ctype});')
    lines += [
        f'extern "C" __global__ void __launch_bounds__({b}) {symbol_for(entry.name, entry_hash)}(',
        "    " + ",\n    ".join(params) + ")",
        "{",
        "    ::khal::Invocation khal_inv;",
        "    khal_inv.group_id = blockIdx.x;",
        "    khal_inv.num_groups = gridDim.x;",
        "    khal_inv.local_id = threadIdx.x;",
        f"    khal_inv.global_id = (unsigned long long)blockIdx.x * {b}u + threadIdx.x;",
        f"    khal_entry_{entry.name}({args});",
        "}",
        f'extern "C" __global__ void __launch_bounds__({b}) {indirect_symbol_for(entry.name, entry_hash)}(',
        "    " + ",\n    ".join(params + ["const unsigned int* khal_group_count"]) + ")",
        "{",
        "    const unsigned long long khal_groups = *khal_group_count;",
        "    for (unsigned long long g = blockIdx.x; g < khal_groups; g += gridDim.x) {",
        "        ::khal::Invocation khal_inv;",
        "        khal_inv.group_id = g;",
        "        khal_inv.num_groups = khal_groups;",
        "        khal_inv.local_id = threadIdx.x;",
        f"        khal_inv.global_id = g * {b}u + threadIdx.x;",
        f"        khal_entry_{entry.name}({args});",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def generate_unit(crate: str, sources: list[Path], entries: list[tuple[EntryDecl, str]]) -> GeneratedUnit:
    """The crate's translation unit: khal.h, each source, then the generated kernels."""
    kernels = "".join(_entry_code(e, h) for e, h in entries)
    head = [f"// Generated by hatch-khal for crate {crate!r}. Do not edit.", "#define KHAL_SCANNED 1"]
    head += [f"constexpr bool khal_scanned_entry_{e.name} = true;" for e, _ in entries]
    head += ['#include "khal.h"']
    includes = [f'#include "{p.as_posix()}"' for p in sources]
    text = "\n".join(head + includes) + "\n\n" + kernels
    return GeneratedUnit(text=text, generated="\n".join(head) + "\n" + kernels)
