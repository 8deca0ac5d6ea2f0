"""Triton entries at run time: a launcher per instance family, with no Triton in the process.

A Triton crate's instance is built as written and, when it assumes anything of its arguments
(``*fp32:16``: a 16-byte aligned pointer; ``i32:16``: an integer divisible by 16), also as a
conservative ``<name>__base`` entry. ``kernels.<name>`` is a :class:`TritonKernel` over both:

* ``k[grid](*args, stream=None)`` (Triton's spelling) or ``k.launch(grid, *args, stream=None)``:
  ``grid`` is the number of programs (an int, or up to three), or a callable given the
  instance's constexprs (``lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)``); ``args`` are
  the kernel's runtime arguments in order (its constexprs are compiled in): a pointer is a torch
  tensor, a CuPy array, anything with ``__cuda_array_interface__`` (a
  :class:`~khal_runtime.buffers.DeviceBuffer`), or an int address; an array's dtype must be the
  pointee's (``*fp32``: float32), else :class:`~khal_runtime.errors.ArgumentError`; scalars are
  Python numbers.
* A pointer must be a multiple of its elements' size (``*fp32``: 4 bytes), else
  :class:`~khal_runtime.errors.ArgumentValueError` (on the GPU: a sticky misaligned-address error).
* Each call checks the assumptions of the variants (alignment of each pointer, divisibility of
  each integer, one ``& 15`` each; ``== 1`` of an integer compiled in as 1, which that variant then
  does not take) and launches the most specialised variant whose assumptions
  hold; the choice is cached by the bits of which assumptions held. With no variant left it raises
  :class:`~khal_runtime.errors.TritonAssumptionError` naming the argument and the assumption.
* The launch is khal's explicit launch of that entry (:meth:`khal_runtime.kernels.Kernel.launch`):
  block ``num_warps * 32``, the instance's dynamic shared memory, the two scratch pointers null
  (an instance needing scratch memory is refused at build for now).
"""

from __future__ import annotations

from typing import Any, Callable

from khal_runtime.errors import ArgumentError, ArgumentValueError, TritonAssumptionError

#: bytes of a pointee (``*fp32`` -> 4): a pointer must be a multiple of it
_POINTEE_SIZE = {"i1": 1, "i8": 1, "u8": 1, "fp8e4nv": 1, "fp8e5": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
                 "i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8}

__all__ = ["TritonKernel", "device_pointer"]


def device_pointer(obj: Any, where: str) -> int:
    """The device address of a pointer argument: torch's ``data_ptr()``, CuPy's ``.data.ptr``, the
    ``__cuda_array_interface__``'s, or an int."""
    if type(obj) is int:
        return obj
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr):
        if getattr(obj, "is_cuda", True) is False:
            raise ArgumentError(f"{where}: a tensor on {getattr(obj, 'device', 'the CPU')}, not on a CUDA device")
        return int(data_ptr())
    data = getattr(obj, "data", None)
    ptr = getattr(data, "ptr", None)
    if type(ptr) is int and hasattr(obj, "__cuda_array_interface__"):
        return ptr
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        return int(cai["data"][0])
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise ArgumentError(f"{where}: {type(obj).__name__} is not a device pointer (a torch tensor, a CuPy array, "
                            "anything with __cuda_array_interface__, or an int address)")
    return int(obj)


#: Triton pointee -> the dtype names an array of it has (torch's without ``torch.``, NumPy's / CuPy's)
_DTYPE_NAMES = {"fp16": ("float16", "half"), "bf16": ("bfloat16",), "fp32": ("float32", "float"),
                "fp64": ("float64", "double"), "i8": ("int8",), "i16": ("int16", "short"), "i32": ("int32", "int"),
                "i64": ("int64", "long"), "u8": ("uint8",), "u16": ("uint16",), "u32": ("uint32",),
                "u64": ("uint64",), "i1": ("bool",)}
#: a dtype object -> its name (torch's without ``torch.``): one str() per dtype, not per call
_dtype_names: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


class TritonKernel:
    """The entries of one Triton instance family (the instance as written and its ``__base`` twin),
    launched as Triton launches a kernel. ``name`` and ``crate`` as a :class:`Kernel` has them;
    ``variants`` the entries' kernels, most specialised first."""

    def __init__(self, name: str, crate: str, variants: list[Any]) -> None:
        self.name = name
        self.crate = crate
        #: most assumptions first: the as-written instance, then its conservative twin
        self.variants = sorted(variants, key=lambda k: -len(k.entry.triton.divisible) - len(k.entry.triton.ones))
        first = self.variants[0].entry
        self.entry = first
        facts = first.triton
        self.kernel = facts.kernel
        self.constexprs: dict[str, Any] = dict(facts.constexprs)
        self.arg_names = tuple(facts.names)
        self.types = tuple(facts.types)
        self._pointer = tuple(t.startswith("*") for t in self.types)
        #: (index, element size - 1) of each pointer to elements wider than a byte
        self._align = tuple((i, _POINTEE_SIZE.get(t[1:], 1) - 1) for i, t in enumerate(self.types)
                            if t.startswith("*") and _POINTEE_SIZE.get(t[1:], 1) > 1)
        for k in self.variants[1:]:
            if tuple(k.entry.triton.types) != self.types or tuple(k.entry.triton.names) != self.arg_names:
                raise ValueError(f"Triton entry {k.entry.name!r} does not take {name!r}'s arguments")
        #: every assumption some variant makes, (argument index, "16" or "1"), and each variant's mask
        checks = sorted({(self.arg_names.index(n), "16") for k in self.variants for n in k.entry.triton.divisible}
                        | {(self.arg_names.index(n), "1") for k in self.variants for n in k.entry.triton.ones})
        self._checks = tuple(checks)
        self._masks = []
        for k in self.variants:
            t = k.entry.triton
            mine = {(self.arg_names.index(n), "16") for n in t.divisible} | \
                {(self.arg_names.index(n), "1") for n in t.ones}
            self._masks.append((sum(1 << checks.index(c) for c in mine), k))
        #: (bit, argument index) of the divisibility checks and of the "equals 1" checks
        self._bits16 = tuple((1 << i, arg) for i, (arg, what) in enumerate(checks) if what == "16")
        self._bits1 = tuple((1 << i, arg) for i, (arg, what) in enumerate(checks) if what == "1")
        self._pointers = tuple(i for i, p in enumerate(self._pointer) if p)
        self._count = len(self.types)
        #: assumption bits -> (the variant's launch, its dynamic shared memory, the variant, the indexes of
        #: the values it takes, or None for all of them: a variant assuming an argument 1 does not take it)
        self._chosen: dict[int, tuple[Any, int, Any, tuple[int, ...] | None]] = {}

    def __repr__(self) -> str:
        return (f"<Triton kernel {self.crate}.{self.name} ({self.kernel}): "
                f"{', '.join(f'{n}: {t}' for n, t in zip(self.arg_names, self.types))}>")

    def _bits(self, values: list[Any]) -> int:
        bits = 0
        for bit, arg in self._bits16:
            v = values[arg]
            if type(v) is int and not v & 15:
                bits |= bit
        for bit, arg in self._bits1:
            if values[arg] == 1 and type(values[arg]) is int:
                bits |= bit
        return bits

    def _choose(self, bits: int, values: list[Any]) -> tuple[Any, int, Any, tuple[int, ...] | None]:
        for mask, k in self._masks:
            if mask & bits == mask:
                ones = set(k.entry.triton.ones)
                keep = None if not ones else tuple(i for i in range(self._count + 2)
                                                   if i >= self._count or self.arg_names[i] not in ones)
                self._chosen[bits] = (k.launch, k.entry.triton.shared, k, keep)
                return self._chosen[bits]
        broken = []
        for i, (arg, what) in enumerate(self._checks):
            if not bits >> i & 1:
                name, v = self.arg_names[arg], values[arg]
                if what == "1":
                    broken.append(f"{name} = {v} is not 1")
                elif self._pointer[arg]:
                    broken.append(f"{name} = {v:#x} is not 16-byte aligned")
                else:
                    broken.append(f"{name} = {v} is not divisible by 16")
        raise TritonAssumptionError(
            f"{self.name}: every binary the crate ships assumes what this call breaks: {'; '.join(broken)} "
            "(build the instance with its conservative twin: leave 'fallback' on)")

    def _pointer_of(self, i: int, a: Any) -> int:
        """Argument ``i`` (a pointer, not an int) as a device address, its dtype checked."""
        dtype = getattr(a, "dtype", None)
        names = _DTYPE_NAMES.get(self.types[i][1:])
        if dtype is not None and names is not None and _dtype_name(dtype) not in names:
            raise ArgumentError(
                f"{self.name}(): argument {self.arg_names[i]!r} is an array of {_dtype_name(dtype)}, "
                f"the kernel was built for {self.types[i]} ({names[0]}): build an instance for it "
                "(a 'matrix' over the type)")
        return device_pointer(a, f"{self.name}(): argument {self.arg_names[i]!r}")

    def _values(self, args: tuple[Any, ...]) -> list[Any]:
        """The kernel's parameters: ``args`` with pointers as addresses, then the two null scratch
        pointers; each pointer checked against its elements' size."""
        if len(args) != self._count:
            raise ArgumentError(f"{self.name}() takes {len(self.types)} argument(s) "
                                f"({', '.join(self.arg_names)}), got {len(args)}")
        out = [*args, 0, 0]
        for i in self._pointers:
            a = out[i]
            if type(a) is not int:
                out[i] = self._pointer_of(i, a)
        for i, mask in self._align:
            if out[i] & mask:
                raise ArgumentValueError(
                    f"{self.name}(): argument {self.arg_names[i]!r} ({self.types[i]}) points at {out[i]:#x}, not a "
                    f"multiple of {mask + 1} bytes (its elements' size): the kernel's loads would fault")
        return out

    def launch(self, grid: Any, *args: Any, stream: Any = None) -> None:
        """Launch ``grid`` programs with the kernel's runtime arguments ``args``."""
        values = self._values(args)
        bits = 0
        for bit, arg in self._bits16:
            v = values[arg]
            if type(v) is int and not v & 15:
                bits |= bit
        if self._bits1:
            bits = self._bits(values)
        chosen = self._chosen.get(bits)
        if chosen is None:
            chosen = self._choose(bits, values)
        if type(grid) is not int:
            if callable(grid):
                grid = grid(self.constexprs)
            if type(grid) in (tuple, list) and len(grid) == 1:
                grid = grid[0]
        keep = chosen[3]
        if keep is not None:
            values = [values[i] for i in keep]
        chosen[0](grid, None, *values, stream=stream, shared_mem=chosen[1])

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        """``k[grid](*args, stream=None)``, as a Triton kernel is called."""
        def run(*args: Any, stream: Any = None) -> None:
            self.launch(grid, *args, stream=stream)
        return run

    def chosen(self, *args: Any) -> str:
        """The entry a call with ``args`` would launch (no launch)."""
        values = self._values(args)
        bits = self._bits(values)
        return str((self._chosen.get(bits) or self._choose(bits, values))[2].entry.name)
