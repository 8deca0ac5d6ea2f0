"""Argument checking: what a launch accepts, and the named error for what it does not.

The launch paths check arguments on their fast paths as cheaply as they can; when anything
is off they call :func:`diagnose_args`, which re-checks every argument slowly and raises an
``ArgumentError`` (a TypeError) or ``ArgumentValueError`` (a ValueError) naming the entry and
the parameter. It needs no GPU: ``Kernel.check_args`` uses it too. The rules for each kind
come from the ABI table (:mod:`khal_runtime.abi`): a scalar is converted by
:func:`khal_runtime.abi.scalar_value` on every path, so every path accepts and refuses the
same values. Launch geometry (thread counts, grids, blocks, shared memory) is checked here too.
"""

from __future__ import annotations

import operator
import struct
from typing import TYPE_CHECKING, Any, Callable, Sequence

from khal_runtime import abi, interop
from khal_runtime.dtypes import ReadOnly, dtype_info
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.generated import define
from khal_runtime.interop import ADDRESS_SPACE, BadArgument
from khal_runtime.packing import pack_cuda
from khal_runtime.uniforms import is_converter, uniform_converter

if TYPE_CHECKING:
    from khal_runtime.manifest import Entry, Param

__all__ = [
    "MAX_GRID",
    "Short",
    "blocks",
    "blocks_source",
    "check_block",
    "check_block_within",
    "check_grid",
    "diagnose_args",
    "dim3",
    "dtype_ok",
    "grid3",
    "grid_for",
    "grid_for_threads",
    "is_empty",
    "misaligned",
    "read_array",
    "shared_mem",
    "struct_bytes",
    "thread_count",
]

#: Blocks a launch may have per grid dimension (CUDA's limits; WebGPU's adapters check theirs).
MAX_GRID = (2**31 - 1, 65535, 65535)


class Short(Exception):
    """Internal: a fast path noticed a problem; :func:`diagnose_args` names it."""


def dim3(v: Any, what: str = "grid") -> tuple[int, int, int]:
    """An int or a sequence of up to 3 ints (NumPy integers too; never floats or bools) as (x, y, z),
    each >= 1: the one reader of launch geometry (blocks, clusters, persistent grids), for the
    CUDA and the WebGPU paths. A grid that may be empty is read by :func:`grid3`."""
    t = _dims(v, what)
    if any(x < 1 for x in t):
        raise ArgumentValueError(f"{what}: every dimension must be >= 1, got {t}")
    return t


def grid3(v: Any, what: str = "grid") -> tuple[int, int, int]:
    """A launch's grid as (x, y, z), read as :func:`dim3` reads it but each dimension >= 0: a
    grid with a 0 in it is an empty launch (no programs, ``cdiv(0, BLOCK)``), which every
    launch path accepts and launches nothing for, as Triton's launcher and CUDA code guarding
    ``cuLaunchKernel`` do (:func:`is_empty`). A negative or non-integer dimension stays an error,
    and so does ``()``: an empty tuple names no dimension, it is not a grid of 0 (Triton's own
    launcher fails on it too)."""
    t = _dims(v, what)
    if any(x < 0 for x in t):
        raise ArgumentValueError(f"{what}: every dimension must be >= 0 (0: launch nothing), got {t}")
    return t


def is_empty(grid: tuple[int, int, int]) -> bool:
    """Whether a grid read by :func:`grid3` has no blocks (launch nothing)."""
    return not (grid[0] and grid[1] and grid[2])


def _dims(v: Any, what: str) -> tuple[int, int, int]:
    try:
        if isinstance(v, (str, bytes, bool)):
            raise TypeError
        t: tuple[int, ...]
        if not hasattr(v, "__len__"):
            t = (operator.index(v), 1, 1)
        else:
            t = tuple(operator.index(x) for x in v) + (1,) * (3 - len(v))
            if any(x.__class__ is bool for x in v):
                raise TypeError  # (2, True): a bool is not a count on any axis either
    except TypeError:
        raise ArgumentError(f"{what}: expected an integer or up to 3 integers, got {v!r}") from None
    if hasattr(v, "__len__") and not len(v):
        raise ArgumentValueError(f"{what}: expected 1 to 3 dimensions, got {v!r} (an empty tuple names no "
                                 "dimension; a grid of no programs is 0 or (0,))")
    if len(t) != 3:
        raise ArgumentValueError(f"{what}: expected 1 to 3 dimensions, got {v!r}")
    return (t[0], t[1], t[2])


def thread_count(kernel: str, n: Any) -> int:
    """A launch's thread count as an int >= 0: ints and NumPy integers, never floats (no
    silent truncation), strings or None."""
    try:
        v = operator.index(n)
    except TypeError:
        raise ArgumentError(
            f"{kernel}(): the first argument is the thread count, an integer >= 0; "
            f"got {n!r} ({type(n).__name__})"
        ) from None
    if v < 0:
        raise ArgumentValueError(f"{kernel}(): thread count must be >= 0, got {v}")
    return v


def blocks_source(n: str, bx: int | str) -> str:
    """The threads-to-grid rule as Python source: the blocks of ``bx`` threads that cover ``n``
    threads, ``ceil(n / bx)``. Its one definition: :func:`blocks` is this compiled, and the
    generated launch code (CUDA, WebGPU) inlines it with ``bx`` a literal, which Python folds
    (``(n + (128 - 1)) // 128`` runs as ``(n + 127) // 128``: no per-launch cost)."""
    return f"({n} + ({bx} - 1)) // {bx}"


#: ``blocks(n, bx)``: :func:`blocks_source` compiled, for a block size known only at run time
blocks: Callable[[int, int], int] = define(f"def blocks(n, bx):\n    return {blocks_source('n', 'bx')}\n",
                                           "arguments.blocks", {}, "blocks")


def grid_for(kernel: str, n: int, bx: int) -> int:
    """Blocks of ``bx`` threads covering ``n`` threads; a named error past the grid limit."""
    gx = blocks(n, bx)
    if gx > MAX_GRID[0]:
        raise ArgumentValueError(
            f"{kernel}(): {n} threads need {gx} blocks of {bx}, more than the {MAX_GRID[0]} a "
            "launch may have; split the work into several launches")
    return gx


_AXES = ("x", "x and y", "x, y and z")


def grid_for_threads(kernel: str, n: Any, block: tuple[int, int, int], dims: int) -> tuple[int, int, int]:
    """The grid covering a typed call's thread count: an integer for a 1-D entry, ``(nx, ny)``
    for a 2-D one, ``(nx, ny, nz)`` for a 3-D one (``dims``: the entry's ``grid_dims``), each
    axis rounded up to whole blocks. A count of 0 on any axis gives a grid with a 0 in it
    (nothing to launch). A count of the other dimensionality is refused, naming both."""
    if dims == 1:
        if isinstance(n, (tuple, list)):
            raise ArgumentError(
                f"{kernel}(): the entry is 1-D (its ids use x only): its thread count is an integer, got {n!r}; "
                "a 2-D / 3-D count needs an entry whose block or ids are 2-D / 3-D")
        return (grid_for(kernel, thread_count(kernel, n), block[0]), 1, 1)
    if not isinstance(n, (tuple, list)) or len(n) != dims:
        hint = ""
        if isinstance(n, int) and not isinstance(n, bool):
            # entries with a 2-D / 3-D block (Slang's numthreads) took an integer before they were
            # called by their dimensionality: that count along x alone is written so now
            hint = f"; {n} threads along x alone is {(n,) + (1,) * (dims - 1)!r}"
        raise ArgumentError(
            f"{kernel}(): the entry is {dims}-D (its ids use {_AXES[dims - 1]}): pass its thread count as "
            f"({', '.join('n' + a for a in 'xyz'[:dims])}), got {n!r}{hint}")
    grid = [1, 1, 1]
    for axis in range(dims):
        try:
            v = operator.index(n[axis])
        except TypeError:
            raise ArgumentError(f"{kernel}(): thread count {n!r}: each axis is an integer >= 0, got "
                                f"{n[axis]!r} ({type(n[axis]).__name__})") from None
        if v < 0:
            raise ArgumentValueError(f"{kernel}(): thread count {n!r}: each axis must be >= 0")
        g = blocks(v, block[axis])
        if g > MAX_GRID[axis]:
            raise ArgumentValueError(
                f"{kernel}(): {v} threads along {'xyz'[axis]} need {g} blocks of {block[axis]}, more than the "
                f"{MAX_GRID[axis]} a launch may have; split the work into several launches")
        grid[axis] = g
    return (grid[0], grid[1], grid[2])


def check_block_within(kernel: str, block: tuple[int, int, int], limit: int) -> None:
    """A block for an entry whose block is not fixed: at most ``limit`` threads (its launch
    bounds) and within CUDA's per-axis limits."""
    threads = block[0] * block[1] * block[2]
    if threads > limit or block[0] > 1024 or block[1] > 1024 or block[2] > 64:
        raise ArgumentValueError(
            f"{kernel}.launch(): block {block} has {threads} threads; the entry was compiled for blocks of at "
            f"most {limit} threads (its launch bounds), at most (1024, 1024, 64) per axis")


def check_grid(kernel: str, grid: tuple[int, int, int], dims: int) -> None:
    """A grid the entry's ids honour (``dims`` dimensions) and the device can launch."""
    if dims < 3 and any(g != 1 for g in grid[dims:]):
        axes = "x" if dims == 1 else "x and y"
        raise ArgumentValueError(
            f"{kernel}.launch(): grid {grid} has more than {dims} dimension(s), but the entry's "
            f"thread ids use {axes} only: the extra blocks would redo the same elements. "
            f"Launch a {dims}-D grid")
    for g, lim, axis in zip(grid, MAX_GRID, "xyz"):
        if g > lim:
            raise ArgumentValueError(f"{kernel}.launch(): grid {axis} = {g} is more than the {lim} "
                                     "a launch may have")


def check_block(kernel: str, block: tuple[int, int, int], compiled: tuple[int, int, int]) -> None:
    """The block must be the one the entry was compiled for: its ids and its
    ``__launch_bounds__`` assume it."""
    if block != compiled:
        raise ArgumentValueError(
            f"{kernel}.launch(): block {block} is not the block size the entry was compiled for "
            f"{compiled}: its thread ids assume that size, so elements would be skipped or done "
            "twice; pass block=None (or the compiled size)")


def shared_mem(kernel: str, v: Any) -> int:
    """Dynamic shared memory in bytes: an int >= 0 (never a float, which would be truncated)."""
    if isinstance(v, bool):
        raise ArgumentError(f"{kernel}.launch(): shared_mem must be an integer number of bytes, got {v!r}")
    try:
        n = operator.index(v)
    except TypeError:
        raise ArgumentError(f"{kernel}.launch(): shared_mem must be an integer number of bytes, "
                            f"got {v!r} ({type(v).__name__})") from None
    if not 0 <= n < 2**32:
        raise ArgumentValueError(f"{kernel}.launch(): shared_mem must be 0..{2**32 - 1} bytes, got {n}")
    return n


def dtype_ok(p: Param, key: Any) -> tuple[bool, str]:
    """Whether an array of dtype ``key`` fits storage parameter ``p``, and how to name that dtype.
    A :class:`~khal_runtime.dtypes.ReadOnly` key fits a read-only binding only."""
    if type(key) is ReadOnly:
        ok, name = dtype_ok(p, key.dtype)
        return ok and not p.writable, f"read-only {name}"
    name, itemsize = dtype_info(key)
    if p.element_type in abi.SCALARS:
        return name == p.element_type, name
    # a struct element: a structured NumPy dtype (or raw void) of exactly its size. Never a
    # scalar, complex or other dtype (datetime64, strings, torch / DLPack types) that merely has
    # the same item size: the size alone says nothing of what the kernel reads
    if name.startswith("<freed"):
        return False, name
    return name == "struct" and itemsize == p.element_size, f"{name} ({itemsize} bytes)"


def read_array(arg: str, obj: Any) -> tuple[int, int, Any]:
    """``interop.extract(obj)`` with every failure a named error for argument ``arg``: the
    extractor's refusals, and whatever a broken or lying array interface raises or returns
    (a KeyError from a dict without ``shape``, a capsule already consumed, a pointer or element
    count outside the 64-bit address space)."""
    try:
        ptr, count, key = interop.extract(obj)
    except BadArgument as bad:
        raise bad.cls(f"{arg} {bad}") from None
    except Exception as exc:  # noqa: BLE001  (a producer's own bug, named for the user)
        tp = type(obj)
        raise ArgumentError(
            f"{arg}: reading it as a device array ({interop.array_type(obj).name}) failed: "
            f"{type(exc).__name__}: {exc}; the array interface of {tp.__module__}.{tp.__qualname__} "
            "is broken: pass another array (e.g. a copy)") from exc
    if type(ptr) is not int or type(count) is not int:
        raise ArgumentError(f"{arg}: its array interface gave pointer {ptr!r} and element count {count!r}, "
                            "not integers; pass another array")
    if not 0 <= ptr < ADDRESS_SPACE or not 0 <= count < ADDRESS_SPACE:
        raise ArgumentValueError(f"{arg}: its array interface gave pointer {ptr} and {count} elements, outside "
                                 "the 64-bit range the kernel takes; pass a real device array")
    return ptr, count, key


def misaligned(arg: str, ptr: int, align: int, element: str) -> str:
    """The message for an array at ``ptr``, not a multiple of its elements' alignment."""
    return (f"{arg}: the array starts at 0x{ptr:x}, not a multiple of {align} bytes (the alignment of "
            f"{element}); a kernel reading it there stops with CUDA_ERROR_MISALIGNED_ADDRESS, which ruins the "
            "context for the whole process. Pass an array starting at an aligned address (a DLPack "
            "byte_offset or a __cuda_array_interface__ pointer that is a whole number of elements in)")


def _check_storage(arg: str, p: Param, obj: Any, device: int | None) -> None:
    _ptr, count, key = read_array(arg, obj)
    if _ptr & (p.element_align - 1):
        raise ArgumentValueError(misaligned(arg, _ptr, p.element_align, p.element_type))
    if type(key) is ReadOnly:
        if p.writable:
            raise ArgumentError(
                f"{arg}: the array is read-only (its producer says so: a read-only "
                "__cuda_array_interface__ or DLPack tensor) and the entry writes this parameter; pass a "
                "writable array (e.g. a copy)")
        key = key.dtype
    if count * p.element_size > ADDRESS_SPACE - _ptr:
        raise ArgumentValueError(f"{arg}: {count} elements of {p.element_size} bytes from 0x{_ptr:x} run past "
                                 "the 64-bit address space; the array's shape is wrong")
    on = interop.device_of(obj) if device is not None else None
    if on is not None and on != device:
        raise ArgumentValueError(
            f"{arg} is on device {on}, the launch is on device {device}: move it "
            f"there, or launch on a stream of device {on}")
    ok, got = dtype_ok(p, key)
    if not ok:
        if got == "<freed buffer>":
            raise ArgumentValueError(f"{arg}: the DeviceBuffer was freed")
        hint = "" if p.element_type in abi.SCALARS else (
            f"; a struct element takes an array of a structured dtype of {p.element_size} bytes "
            f"(np.dtype([...]), or any array viewed as np.dtype('V{p.element_size}'))")
        raise ArgumentError(f"{arg}: expected element type {p.element_type} "
                            f"({p.element_size} bytes), got {got}{hint}")
    if p.shape == "array" and p.length and count < p.length:
        raise ArgumentValueError(f"{arg}: needs {p.length} elements, got {count}")
    if p.shape == "value" and count < 1:
        raise ArgumentValueError(f"{arg}: needs 1 element, got an empty array")


def struct_bytes(arg: str, p: Param, obj: Any) -> bytes | tuple[int, int]:
    """A uniform argument as the struct's bytes in its C layout, or (device pointer, bytes) of a
    device array holding it; a dict of fields is packed by the struct's layout (Slang crates
    record it: ``Param.layouts["cuda"]``)."""
    if isinstance(obj, dict):
        layout = (p.layouts or {}).get("cuda")
        if layout is None:
            raise ArgumentError(f"{arg}: a dict of fields needs the struct's layout, which only Slang "
                                "crates record; pass a ctypes Structure, a NumPy structured scalar or "
                                "the struct's bytes")
        return pack_cuda(layout, obj, arg)
    try:
        conv = uniform_converter(obj)
        if not is_converter(conv, "device"):
            return conv(obj)
    except BadArgument as bad:
        raise bad.cls(f"{arg}: {bad}") from None
    except Exception as exc:  # noqa: BLE001  (a struct type whose conversion is broken)
        raise ArgumentError(f"{arg}: converting {type(obj).__name__} to the struct's bytes failed: "
                            f"{type(exc).__name__}: {exc}") from exc
    # a device array holding the struct: read like a storage argument (every failure named)
    ptr, count, key = read_array(arg, obj)
    return ptr, count * dtype_info(key)[1]


def _check_struct(arg: str, p: Param, obj: Any) -> None:
    u = struct_bytes(arg, p, obj)
    if isinstance(u, bytes):
        if len(u) != p.element_size:
            raise ArgumentValueError(f"{arg}: expected {p.element_size} bytes, got {len(u)} "
                                     f"({type(obj).__name__})")
    elif u[1] < p.element_size:
        raise ArgumentValueError(
            f"{arg}: the device buffer holds {u[1]} bytes, the struct needs {p.element_size}")
    elif u[0] & (p.element_align - 1):
        raise ArgumentValueError(misaligned(arg, u[0], p.element_align, f"struct {p.element_type}"))


def check_scalar(arg: str, p: Param, obj: Any) -> Any:
    """The value to pack for scalar ``p`` (:func:`abi.scalar_value`), or the named error."""
    try:
        v = abi.scalar_value(p.element_type, obj)
        struct.pack("<" + abi.SCALARS[p.element_type].code, *(v if isinstance(v, tuple) else (v,)))
    except TypeError as e:
        raise ArgumentError(f"{arg}: {e}") from None
    except (ValueError, OverflowError, struct.error) as e:
        raise ArgumentValueError(f"{arg}: cannot pass {obj!r}: {e}") from None
    return v


#: how an argument of each reader is checked (arg, param, object, device): the slow path's diagnosis
_CHECKS: abi.ReaderTable[Callable[[str, Param, Any, "int | None"], Any]] = abi.ReaderTable(
    "khal_runtime.arguments", {
        "array": _check_storage,
        "struct": lambda arg, p, obj, device: _check_struct(arg, p, obj),
        "value": lambda arg, p, obj, device: check_scalar(arg, p, obj),
    })


def diagnose_args(entry: Entry, args: Sequence[Any], exc: BaseException | None = None,
                  device: int | None = None) -> None:
    """Check ``args`` against ``entry`` without a GPU; raise ArgumentError/ArgumentValueError.
    With ``device`` (the launch's), an array known to be on another device is refused too:
    a kernel reading another device's memory fails with an illegal address, and that error
    ruins the context for every later call.

    Returns normally if every argument is acceptable."""
    params = entry.params
    where = f"{entry.name}()"
    if len(args) != len(params):
        sig = ", ".join(p.name for p in params)
        raise ArgumentError(
            f"{where} takes {len(params)} argument(s) ({sig}) after the thread count, got {len(args)}"
        )
    for p, obj in zip(params, args):
        arg = f"{where}: argument {p.name!r} ({p.describe()})"
        _CHECKS.of(p.kind, f"{where}: argument {p.name!r}")(arg, p, obj, device)
    if isinstance(exc, Short):
        raise ArgumentError(f"{where}: the arguments do not match the entry's parameters")
    # nothing wrong with the arguments: the caller re-raises the original error
