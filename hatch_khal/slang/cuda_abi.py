"""Slang's whole-module CUDA source -> one translation unit for NVRTC with khal-ABI kernels.

Slang emits each entry as ``extern "C" __global__ void <entry>(<Slang's parameters>)`` where a
buffer is a 16-byte struct ``{T* data; size_t count;}`` passed by value, a ``ConstantBuffer<S>`` a
pointer and a scalar a value. This module

* demotes each entry to ``static __device__ __forceinline__ void <entry>(uint3 khal_bid_, dim3
  khal_gdim_, <Slang's parameters>)`` (exactly one definition each, else an error), with
  ``#define blockIdx khal_bid_`` / ``#define gridDim khal_gdim_`` after Slang's prelude so that the
  body's ``SV_GroupID`` / ``SV_DispatchThreadID`` come from those two parameters;
* appends, after ``#line 1 "<generated>"`` (so NVRTC errors in wrappers are not blamed on a .slang
  file, while Slang's own ``#line`` keeps body errors at file(line)):

  - ``extern "C" __global__ __launch_bounds__(X*Y*Z) <entry>_khal_<hash>``: the khal ABI (per
    storage ``T*`` + ``unsigned long long`` element count, per uniform ``const void*``, scalars by
    value), which builds Slang's buffer structs (types taken with ``decltype`` of the body's
    parameters: Slang's internal names are never spelled) and calls the body with the real
    ``blockIdx`` / ``gridDim``;
  - ``<entry>_indirect_khal_<hash>``: the same parameters plus ``const unsigned int* group_count``;
    a persistent grid reads the count once per block (``__shared__``, clamped to 0x7fffffff) and
    runs groups ``blockIdx.x, blockIdx.x + gridDim.x, ...`` below it, calling the body with
    ``(g, 0, 0)`` / ``(n, 1, 1)`` and a ``__syncthreads()`` after each group (groupshared memory is
    reused);
  - the size probes ``khal_sizeof_<entry>_<i>`` / ``khal_alignof_<entry>_<i>`` of the CUDA path
    (:func:`hatch_khal.codegen.probe_names`), so the shared assembly step reads the compiler's own
    element sizes back from the PTX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from khal_runtime import abi

from hatch_khal.codegen import probe_names
from hatch_khal.errors import CompileError
from hatch_khal.slang.entries import SlangEntry

__all__ = ["CODEGEN_VERSION", "DEFAULT_NVRTC_OPTIONS", "CudaUnit", "build_cuda_unit", "nvrtc_options"]

#: Bumped whenever the generated code changes: part of every Slang crate's content hash.
CODEGEN_VERSION = 2  # 2: entry hashes cover the uniforms' CUDA layouts
#: NVRTC options every Slang unit gets: C++17, the warnings Slang's prelude causes (#1444, #222; #177
#: for its unused half-precision surface templates) silenced, and
#: no FMA contraction (Vulkan / WebGPU need not fuse ``a*x+y``: CUDA then agrees bit for bit).
DEFAULT_NVRTC_OPTIONS = ["-std=c++17", "-diag-suppress=1444,222,177", "--fmad=false"]
_FMAD_RE = re.compile(r"-{1,2}fmad(=|\Z)")
_DEMOTED = "static __device__ __forceinline__ void"
#: Types in Slang's CUDA output that need a feature of its prelude: (type, define, header).
#: Slang passes these defines to NVRTC itself when it compiles; here the hook does.
_FEATURES = (
    ("__half", "SLANG_CUDA_ENABLE_HALF", "cuda_fp16.h"),
    ("__nv_bfloat16", "SLANG_CUDA_ENABLE_BF16", "cuda_bf16.h"),
    ("__nv_fp8_e4m3", "SLANG_CUDA_ENABLE_FP8", "cuda_fp8.h"),
    ("__nv_fp8_e5m2", "SLANG_CUDA_ENABLE_FP8", "cuda_fp8.h"),
)

_HELPERS = """\
// khal: parameter types of the demoted Slang bodies, read with decltype.
template<int I, typename... A> struct khal_nth_;
template<typename A0, typename... A> struct khal_nth_<0, A0, A...> { typedef A0 type; };
template<int I, typename A0, typename... A> struct khal_nth_<I, A0, A...> { typedef typename khal_nth_<I - 1, A...>::type type; };
template<typename F> struct khal_fn_;
template<typename... A> struct khal_fn_<void(A...)> { template<int I> struct arg { typedef typename khal_nth_<I, A...>::type type; }; };
template<typename T> struct khal_deref_ { typedef T type; };
template<typename T> struct khal_deref_<T*> { typedef T type; };
template<typename B> struct khal_elem_ { typedef typename khal_deref_<decltype(B::data)>::type type; };
"""


@dataclass(frozen=True)
class CudaUnit:
    """The translation unit NVRTC compiles for a Slang crate."""

    text: str
    #: NVRTC options it needs (defaults, then the crate's own), without ``--gpu-architecture``
    options: list[str]
    #: CUDA toolkit headers the unit includes (``cuda_fp16.h`` when the module uses ``half``):
    #: the builder puts the CUDA headers on the include path for these, as for CUDA crates
    system_includes: tuple[str, ...] = ()


def nvrtc_options(user: list[str]) -> list[str]:
    """The defaults, minus ``--fmad=false`` if the crate sets ``--fmad`` itself, then the crate's."""
    base = [o for o in DEFAULT_NVRTC_OPTIONS if not (_FMAD_RE.match(o) and any(_FMAD_RE.match(u) for u in user))]
    return base + list(user)


def _matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket closing the one at ``start`` (-1 if none)."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _demote(module: str, entry: SlangEntry, crate: str) -> str:
    """``module`` with ``entry``'s kernel turned into a device function taking the group id / count."""
    pattern = re.compile(rf'extern\s+"C"\s+__global__\s+void\s+{re.escape(entry.name)}\s*\(')
    found = list(pattern.finditer(module))
    if len(found) != 1:
        raise CompileError(
            f"crate {crate!r}: entry {entry.name!r}: Slang's CUDA output holds {len(found)} definitions of "
            f"'extern \"C\" __global__ void {entry.name}(' where exactly one was expected; please report "
            "this with the crate's sources"
        )
    m = found[0]
    close = _matching(module, m.end() - 1, "(", ")")
    empty = close > 0 and module[m.end():close].strip() == ""
    head = f"{_DEMOTED} {entry.name}(uint3 khal_bid_, dim3 khal_gdim_{'' if empty else ', '}"
    return module[: m.start()] + head + module[m.end():]


def _body_span(module: str, e: SlangEntry) -> tuple[int, int]:
    """Start and end (closing brace) of a demoted entry's definition."""
    m = re.search(rf"{_DEMOTED} {re.escape(e.name)}\(", module)
    if m is None:  # pragma: no cover - _demote just wrote it
        return (0, 0)
    close = _matching(module, m.end() - 1, "(", ")")
    brace = module.find("{", close)
    end = _matching(module, brace, "{", "}") if brace >= 0 else -1
    return (m.start(), end if end >= 0 else len(module))


def _check_builtins_in_bodies(module: str, spans: list[tuple[int, int]], crate: str) -> None:
    """``blockIdx`` / ``gridDim`` may be read only inside the entries' bodies (they become parameters)."""
    for m in re.finditer(r"\b(blockIdx|gridDim)\b", module):
        if not any(a <= m.start() <= b for a, b in spans):
            line = module.count("\n", 0, m.start())
            snippet = module[m.start() - 80 if m.start() > 80 else 0: m.end() + 40].replace("\n", " ")
            raise CompileError(
                f"crate {crate!r}: Slang's CUDA output reads {m.group(1)} outside an entry function "
                f"(a helper it did not inline, near line {line} of its output: ...{snippet}...). The khal "
                "wrappers remap the group id and count only in entry bodies: pass SV_GroupID / "
                "SV_DispatchThreadID to the helper as a parameter instead"
            )


def _wrap_array(t: str, i: int) -> tuple[str, list[str], list[str], str]:
    return (f"khal_elem_<{t}>::type",
            [f"khal_elem_<{t}>::type* khal_p{i}_ptr", f"unsigned long long khal_p{i}_len"],
            [f"    {t} khal_b{i}_;", f"    khal_b{i}_.data = khal_p{i}_ptr;",
             f"    khal_b{i}_.count = (size_t)khal_p{i}_len;"],
            f"khal_b{i}_")


#: per reader, from (Slang's parameter type name, index): (the element type probed, the kernel
#: parameters, the lines building Slang's parameter, the argument passed to the entry)
_WRAP: abi.ReaderTable[Callable[[str, int], tuple[str, list[str], list[str], str]]] = abi.ReaderTable(
    "hatch_khal.slang.cuda_abi", {
        "array": _wrap_array,
        "struct": lambda t, i: (f"khal_deref_<{t}>::type", [f"const void* khal_p{i}"], [], f"({t})khal_p{i}"),
        "value": lambda t, i: (t, [f"{t} khal_p{i}"], [], f"khal_p{i}"),
    })


def _entry_code(e: SlangEntry) -> str:
    n = e.name
    lines = [f"// entry {n} ({e.where}): block {e.block_size[0]}x{e.block_size[1]}x{e.block_size[2]}"]
    kparams: list[str] = []
    build: list[str] = []
    args = []
    for i, p in enumerate(e.params):
        t = f"khal_t_{n}_{i}"
        lines.append(f"typedef khal_fn_<decltype({n})>::arg<{i + 2}>::type {t};")
        size_name, align_name = probe_names(n, i)
        # what the kernel receives is the reader's (khal_runtime.abi.READERS); how Slang's own
        # parameter is built from it is Slang's: one function per reader (_WRAP)
        elem, kp, b, a = _WRAP.of(p.kind, f"Slang CUDA wrapper of entry {n!r}")(t, i)
        kparams += kp
        build += b
        args.append(a)
        lines.append(f'extern "C" __device__ const unsigned long long {size_name} = sizeof({elem});')
        lines.append(f'extern "C" __device__ const unsigned long long {align_name} = alignof({elem});')
    threads = e.threads
    plist = ",\n    ".join(kparams)
    call = ", ".join(args)
    lines += [
        f'extern "C" __global__ void __launch_bounds__({threads}) {e.symbol}(',
        f"    {plist})",
        "{",
        *build,
        f"    {n}(blockIdx, gridDim, {call});",
        "}",
        f'extern "C" __global__ void __launch_bounds__({threads}) {e.indirect_symbol}(',
        f"    {plist},",
        "    const unsigned int* khal_group_count)",
        "{",
        "    __shared__ unsigned int khal_groups_;",
        "    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {",
        "        const unsigned int khal_c_ = *khal_group_count;",
        "        khal_groups_ = khal_c_ > 0x7fffffffu ? 0x7fffffffu : khal_c_;",
        "    }",
        "    __syncthreads();",
        "    const unsigned int khal_n_ = khal_groups_;",
        *build,
        "    for (unsigned int khal_g_ = blockIdx.x; khal_g_ < khal_n_; khal_g_ += gridDim.x) {",
        f"        {n}(make_uint3(khal_g_, 0, 0), dim3(khal_n_, 1, 1), {call});",
        "        __syncthreads();",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def build_cuda_unit(crate: str, code: str, prelude_chars: int, entries: list[SlangEntry],
                    user_options: list[str]) -> CudaUnit:
    """The NVRTC translation unit of a Slang crate (see the module docstring)."""
    if prelude_chars < 0 or prelude_chars > len(code):
        raise CompileError(f"crate {crate!r}: Slang's CUDA output does not start with its CUDA prelude; "
                           "this version of Slang is not supported (use slangpy==0.43.1)")
    prelude, module = code[:prelude_chars], code[prelude_chars:]
    for e in entries:
        module = _demote(module, e, crate)
    _check_builtins_in_bodies(module, [_body_span(module, e) for e in entries], crate)
    features = sorted({(d, h) for t, d, h in _FEATURES if re.search(rf"\b{t}\b", module)})
    text = "".join([
        *(f"#define {d} 1\n" for d, _ in features),
        prelude,
        "\n// khal: the group id and count of the Slang bodies are parameters (direct and indirect launch)\n",
        "#define blockIdx khal_bid_\n#define gridDim khal_gdim_\n",
        module,
        "\n#undef blockIdx\n#undef gridDim\n",
        f'#line 1 "<generated>"\n// Generated by hatch-khal for Slang crate {crate!r}. Do not edit.\n',
        _HELPERS,
        *(_entry_code(e) for e in entries),
    ])
    return CudaUnit(text=text, options=nvrtc_options(user_options),
                    system_includes=tuple(sorted({h for _, h in features})))
