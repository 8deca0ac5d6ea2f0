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
* The first call of each combination of assumption bits, pointer types and dtypes goes through
  khal's explicit launch of the entry (:meth:`khal_runtime.kernels.Kernel.launch`, every check):
  block ``num_warps * 32``, the instance's dynamic shared memory, the two scratch pointers null (an
  instance needing scratch memory is refused at build for now). After it, ``launch`` is Python
  generated for the family (:meth:`TritonKernel._generate`, ``k.source``): each pointer read by
  the reader of its type (``data_ptr()``, a DeviceBuffer's ``ptr``, CuPy's ``.data.ptr``, the
  ``__cuda_array_interface__``), its dtype and alignment checked, the bits computed inline
  (``p & 15``, ``n & 15``, ``== 1``), the variant looked up by them, the grid checked inline and the
  launch made by the variant's plan (its ``run``, which packs and range-checks the values) on this
  thread's device. Anything it has not seen accepted goes back to the checked path.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from khal_runtime.arguments import dim3
from khal_runtime.buffers import FREED, DeviceBuffer
from khal_runtime.device import Stream, _tls
from khal_runtime.errors import ArgumentError, ArgumentValueError, TritonAssumptionError
from khal_runtime.generated import define

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


#: a dtype key no accepted set holds (a tensor off the GPU, a freed buffer): the fast call goes slow
_BAD = object()
#: an argument the fast call was not given (its arguments have defaults: a short call gets the named error)
_MISSING = object()


def _torch_reader(a: Any) -> tuple[int, Any]:
    return a.data_ptr(), (a.dtype if getattr(a, "is_cuda", True) is not False else _BAD)


def _buffer_reader(a: Any) -> tuple[int, Any]:
    base = a._base
    live = a._et != FREED and (base is None or base._et != FREED) and getattr(a._bk, "name", "cuda") == "cuda"
    return a.ptr, (a.dtype if live else _BAD)


def _cupy_reader(a: Any) -> tuple[int, Any]:
    return a.data.ptr, getattr(a, "dtype", None)


def _cai_reader(a: Any) -> tuple[int, Any]:
    return int(a.__cuda_array_interface__["data"][0]), getattr(a, "dtype", None)


def _reader_for(obj: Any) -> Callable[[Any], tuple[int, Any]] | None:
    """How the fast call reads a pointer of ``type(obj)`` (as :func:`device_pointer` does), or None."""
    if type(obj) is DeviceBuffer:
        return _buffer_reader
    if callable(getattr(obj, "data_ptr", None)):
        return _torch_reader
    if type(getattr(getattr(obj, "data", None), "ptr", None)) is int and hasattr(obj, "__cuda_array_interface__"):
        return _cupy_reader
    if isinstance(getattr(obj, "__cuda_array_interface__", None), dict):
        return _cai_reader
    return None


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
        #: the fast call's state (:meth:`_generate`): per pointer argument, type -> reader and the dtypes
        #: seen accepted; assumption bits -> (the variant's plans by device, its shared memory, block, index)
        self._readers: dict[int, dict[type, Callable[[Any], tuple[int, Any]]]] = {i: {} for i in self._pointers}
        self._dtypes: dict[int, set[Any]] = {i: set() for i in self._pointers}
        self._fast_chosen: dict[int, tuple[dict[int, Any], int, int, int]] = {}
        #: the backends of the DeviceBuffers seen accepted (CUDA's): the fast call reads those inline
        self._backends: set[Any] = set()
        self.source = ""
        #: ``launch(grid, *args, stream=None)``: generated over khal Kernels, else the slow path
        self._fast: Callable[..., None] | None = None
        self.launch: Callable[..., None] = self._launch_slow
        #: grid -> ``functools.partial(self.launch, grid)`` (:meth:`__getitem__`)
        self._grids: dict[Any, Callable[..., None]] = {}
        # over khal Kernels (what the generated call reads of them: their plans by device, block, crate)
        if all(hasattr(k, "_plans") and hasattr(k, "_bx") and hasattr(k, "_crate") for k in self.variants):
            self.launch = self._fast = self._generate()

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

    def _launch_slow(self, grid: Any, *args: Any, stream: Any = None) -> None:
        """A launch through :meth:`Kernel.launch` with every check; what it accepted (the types and
        dtypes of the pointers, the variant of the assumption bits) the fast call takes from then on."""
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
        if self._fast is not None:
            self._learn(bits, chosen, args)

    def _learn(self, bits: int, chosen: tuple[Any, int, Any, tuple[int, ...] | None], args: tuple[Any, ...]) -> None:
        """After a launch the slow path checked: let the fast call take these pointer types and
        dtypes, and these assumption bits."""
        for i in self._pointers:
            a = args[i]
            if type(a) is int:
                continue
            reader = self._readers[i].get(type(a)) or _reader_for(a)
            if reader is None:
                return
            self._readers[i][type(a)] = reader
            self._dtypes[i].add(getattr(a, "dtype", None))
            if type(a) is DeviceBuffer:
                self._backends.add(a._bk)  # a CUDA one: the slow path read its __cuda_array_interface__
        k = chosen[2]
        self._fast_chosen[bits] = (k._plans, chosen[1], k._bx, self.variants.index(k))

    def _generate(self) -> Callable[..., None]:
        """The fast call ``launch(grid, a0, ..., stream=None)`` of this family (:mod:`khal_runtime.generated`):
        pointers read by a reader per type, alignment and assumption bits inline, the variant by the
        bits, launched by its plan's ``run`` on this thread's device; anything it has not seen the slow
        path accept (a new pointer type or dtype, new bits, another device, a callable grid giving
        something else, a stream object other than a Stream) goes to :meth:`_launch_slow`."""
        n = self._count
        names = [f"a{i}" for i in range(n)]
        allargs = ", ".join(names)
        slow = f"return slow(grid, {allargs + ', ' if n else ''}stream=stream)"
        sig = "".join(f"{a}=MISSING, " for a in names)
        given = "(" + "".join(f"{a}, " for a in names) + ")"
        L = [f"def launch(grid, {sig}*more, stream=None):",
             f"    if more{f' or {names[-1]} is MISSING' if n else ''}:",
             f"        return slow(grid, *(a for a in {given} if a is not MISSING), *more, stream=stream)",
             "    if crate._backend is None:", f"        {slow}"]
        align = dict(self._align)
        for i in range(n):
            if self._pointer[i]:
                L += [f"    t = type(a{i})", "    if t is int:", f"        v{i} = a{i}",
                      # a DeviceBuffer of a CUDA backend seen accepted, live, not a view: read inline
                      f"    elif t is DeviceBuffer and a{i}._base is None and a{i}._et != FREED and a{i}._bk in BK "
                      f"and a{i}.dtype in D{i}:", f"        v{i} = a{i}.ptr", "    else:",
                      f"        rd = R{i}.get(t)", "        if rd is None:", f"            {slow}",
                      f"        v{i}, d = rd(a{i})", f"        if d not in D{i}:", f"            {slow}"]
                if i in align:
                    L += [f"    if v{i} & {align[i]}:", f"        {slow}"]
            else:
                L.append(f"    v{i} = a{i}")
        L.append("    bits = 0")
        for i, (arg, what) in enumerate(self._checks):
            if what == "16":
                cond = f"not v{arg} & 15" if self._pointer[arg] else f"type(v{arg}) is int and not v{arg} & 15"
            else:
                cond = f"type(v{arg}) is int and v{arg} == 1"
            L += [f"    if {cond}:", f"        bits |= {1 << i}"]
        L += ["    c = chosen.get(bits)", "    if c is None:", f"        {slow}", "    plans, shmem, bx, which = c",
              "    if stream is None:", "        st = getattr(thread, 'stream', None)", "        if st is None:",
              f"            {slow}", "    elif type(stream) is Stream:", "        st = stream", "    else:",
              f"        {slow}", "    plan = plans.get(st.device_id)",
              "    if plan is None or getattr(thread, 'dev', -1) != st.device_id:", f"        {slow}",
              "    g = grid", "    if type(g) is tuple and len(g) == 1:", "        g = g[0]",
              "    if type(g) is not int:", "        if type(g) is not tuple:",
              "            if not callable(g):", f"                {slow}", "            g = g(constexprs)",
              "        if type(g) is int:", "            gx = g", "            gy = gz = 1",
              "        elif type(g) is tuple and 0 < len(g) <= 3:",
              "            gx, gy, gz = (*g, 1, 1)[:3]", "            if type(gx) is not int or type(gy) is not int or "
              "type(gz) is not int or not (0 < gy <= 65535 and 0 < gz <= 65535):", f"                {slow}",
              "        else:", f"            {slow}", "    else:", "        gx = g", "        gy = gz = 1",
              "    if not 0 < gx <= 2147483647:", f"        {slow}"]
        packs = []
        for k in self.variants:
            ones = set(k.entry.triton.ones)
            packs.append("".join(f"v{i}, " for i in range(n) if self.arg_names[i] not in ones) + "0, 0")
        if len(set(packs)) == 1:  # every variant takes the same values (no "== 1" assumption)
            L += [f"    plan.run(gx, gy, gz, bx, 1, 1, shmem, st, ({packs[0]}))"]
        else:
            for j, vals in enumerate(packs):
                L += [f"    {'if' if j == 0 else 'elif'} which == {j}:", f"        vals = ({vals})"]
            L += ["    plan.run(gx, gy, gz, bx, 1, 1, shmem, st, vals)"]
        ns: dict[str, Any] = {"slow": self._launch_slow, "crate": self.variants[0]._crate, "chosen": self._fast_chosen,
                              "thread": _tls, "Stream": Stream, "constexprs": self.constexprs, "MISSING": _MISSING,
                              "DeviceBuffer": DeviceBuffer, "FREED": FREED, "BK": self._backends}
        for i in self._pointers:
            ns[f"R{i}"], ns[f"D{i}"] = self._readers[i], self._dtypes[i]
        self.source = "\n".join(L) + "\n"
        return define(self.source, f"triton {self.name}", ns, "launch")  # type: ignore[no-any-return]

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        """``k[grid](*args, stream=None)``, as a Triton kernel is called. The launcher of an int or
        tuple grid is kept (up to 64 of them): ``k[(n,)]`` in a loop makes no new object per call."""
        t = type(grid)
        if t is tuple or t is int:
            try:
                go = self._grids.get(grid)
            except TypeError:  # a tuple holding something unhashable: the launch names what is wrong
                return functools.partial(self.launch, grid)
            if go is None:
                go = functools.partial(self.launch, grid)
                if len(self._grids) < 64:
                    self._grids[grid] = go
            return go
        return functools.partial(self.launch, grid)

    def bind(self, *args: Any, stream: Any = None) -> TritonBound:
        """``b = k.bind(*args, stream=None)``, then ``b(grid)``: the arguments checked once (the
        variant chosen, as a call with them would), packed once, and each ``b(grid)`` launches at
        about the cost of a raw launch (a bound launch of the variant, :meth:`Kernel.bind`)."""
        values = self._values(args)
        bits = self._bits(values)
        chosen = self._chosen.get(bits) or self._choose(bits, values)
        keep = chosen[3]
        if keep is not None:
            values = [values[i] for i in keep]
        k = chosen[2]
        return TritonBound(self, k, k.bind(*values, stream=stream))

    def chosen(self, *args: Any) -> str:
        """The entry a call with ``args`` would launch (no launch)."""
        values = self._values(args)
        bits = self._bits(values)
        return str((self._chosen.get(bits) or self._choose(bits, values))[2].entry.name)


class TritonBound:
    """A bound launch of a Triton family (:meth:`TritonKernel.bind`): ``b(grid)``, a grid of programs
    (an int, up to three dims, or a callable of the constexprs), launched through the chosen
    variant's bound launch (threads = programs x block along x)."""

    __slots__ = ("family", "variant", "bound", "_bx", "_last")

    def __init__(self, family: TritonKernel, variant: Any, bound: Any) -> None:
        self.family, self.variant, self.bound = family, variant, bound
        self._bx = int(variant.entry.block_size[0])
        #: (the last grid object, its thread counts): a repeated grid launches with the same counts
        self._last: tuple[Any, Any] = (object(), None)

    def __repr__(self) -> str:
        return f"<TritonBound {self.family.crate}.{self.family.name} -> {self.variant.entry.name}>"

    def __call__(self, grid: Any) -> None:
        last = self._last
        if grid is last[0]:
            self.bound(last[1])
            return
        g = grid(self.family.constexprs) if callable(grid) else grid
        if type(g) in (tuple, list) and len(g) == 1:
            g = g[0]
        gx, gy, gz = dim3(g, f"{self.family.name}[grid]: grid")
        counts = (gx * self._bx, gy, gz)
        self._last = (grid, counts)
        self.bound(counts)
