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
  block ``num_warps * 32``, the instance's dynamic shared memory, the two scratch pointers null
  unless the instance needs scratch memory (then pointers to the stream's scratch buffer for the
  grid's programs, :mod:`khal_runtime.scratch`), ``num_ctas`` blocks per program (a cluster,
  compiled in) when above 1 (:meth:`TritonKernel._launch_variant`; the fast call does the same
  inline). After it, ``launch`` is Python
  generated for the family (:meth:`TritonKernel._generate`, ``k.source``), two paths:

  1. a repeat: the same argument objects (``is``), the same grid object (an int or a tuple; a
     callable grid is evaluated on every call), the same stream, each tensor's ``data_ptr()`` and
     dtype the ones packed, nothing freed since (``memo.EPOCH``): the block this thread packed then is
     launched as it is, with the launch call's arguments prebuilt (one of ``SLOTS`` memo slots per
     thread; nothing read, checked, chosen or packed again; the address is all a Triton kernel is
     given of a tensor, so an in-place write keeps the memo and a moved tensor does not, nor one
     given another dtype at the same address by ``.data =``); a slot
     hit ``PROMOTE_AFTER`` times becomes one of ``SLOTS`` shared snapshots of the family (a copy of
     its block nothing writes again), which every thread checks first, with no thread-local read,
     as the CUDA typed call does;
  2. else, in the same function: each pointer read by the reader of its type (``data_ptr()``, a
     DeviceBuffer's ``ptr``, CuPy's ``.data.ptr``, the ``__cuda_array_interface__``), its dtype and
     alignment checked, the bits computed inline (``p & 15``, ``n & 15``, ``== 1``), the variant
     looked up by them, the grid checked inline, the values packed into a memo slot's block and
     launched with ``cuLaunchKernel`` on this thread's device (the plan's
     :meth:`~khal_runtime.backends.cuda.launch.LaunchPlan.direct` parts), then remembered. Scalars
     other than Python ints and floats, entries with launch attributes and launches while launch
     hooks are installed go through the variant's plan's ``run`` (which also packs and range-checks).

  Anything it has not seen accepted goes back to the checked path, which raises the named error.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import Any, Callable

from khal_runtime import abi, capture_state, scratch
from khal_runtime.arguments import MAX_GRID, grid3, is_empty
from khal_runtime.buffers import FREED, DeviceBuffer
from khal_runtime.device import (TORCH_TENSOR_TYPES, Stream, _tls, as_stream, current_device_id, default_stream,
                                 is_torch_tensor, ready_stream, torch_stream)
from khal_runtime.errors import (ArgumentError, ArgumentValueError, CaptureError, KhalError, TritonAssumptionError,
                                 TritonAutotuneError)
from khal_runtime.generated import define
from khal_runtime.dtypes import dtype_info
from khal_runtime.interop import STABLE_ARRAY_TYPES, array_type, device_of
from khal_runtime.launch_hooks import hooks
from khal_runtime.memo import EPOCH, bump_epoch, register_memo

#: bytes of a pointee (``*fp32`` -> 4): a pointer must be a multiple of it
_POINTEE_SIZE = {"i1": 1, "i8": 1, "u8": 1, "fp8e4nv": 1, "fp8e5": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
                 "i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8}

__all__ = ["TritonKernel", "device_pointer"]


def _device_for(stream: Any) -> int:
    """The device a launch on ``stream`` (None: this thread's stream) runs on."""
    if stream is None:
        st = _tls.__dict__.get("stream")
        return st.device_id if st is not None else current_device_id()
    return (stream if type(stream) is Stream else as_stream(stream)).device_id


def _int_address(a: Any) -> int | None:
    """An address given as an integral scalar of another type than int (an ``IntEnum``, a NumPy
    integer: not an array, which has a dtype of its own), else None."""
    tp = type(a)
    if isinstance(a, int) and tp is not bool:
        return int(a)
    if tp.__module__ == "numpy" and tp.__name__ != "ndarray":
        v = abi.integral(a)
        return v if type(v) is int else None
    return None


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
    addr = abi.integral(obj)
    if type(addr) is not int:
        raise ArgumentError(f"{where}: {type(obj).__name__} is not a device pointer (a torch tensor, a CuPy array, "
                            "anything with __cuda_array_interface__, or an int address)")
    return addr


#: memo slots per thread and family, and shared snapshots per family (distinct launches
#: remembered, as the typed call's)
SLOTS = 4
#: hits of a thread's memo slot that make it a shared snapshot (then counted again from 0, so
#: threads cycling through more launches than SLOTS share one at most once per this many)
PROMOTE_AFTER = 8
#: timing an autotuned family's configs: rounds (round robin over the configs, the best round
#: kept) of this many launches each between a pair of the backend's timer events, after one
#: warm-up launch of each config
TUNE_ROUNDS = 3
TUNE_LAUNCHES = 5
#: ``KHAL_TRITON_CONFIG="family=N,crate.family=N"``: the config an autotuned family launches (no timing)
CONFIG_VAR = "KHAL_TRITON_CONFIG"
#: a slot field no argument is identical to
NOMEMO = object()
#: one family's state made at a time (:meth:`TritonKernel.__getattr__`)
_SETUP_LOCK = threading.RLock()


class _ThreadOwner:
    """Owns one thread's memo slots of one family in ``memo.THREAD_MEMOS``."""

    __slots__ = ("__weakref__",)


class _ThreadSlots:
    """One thread's memo slots of one family: ``all`` (also ``s0``..), ``victim`` (the slot the
    next full read fills), ``filled`` (whether any was ever filled), ``owner``."""

    __slots__ = ("all", *(f"s{j}" for j in range(SLOTS)), "victim", "filled", "owner")

    all: tuple[Any, ...]
    victim: int
    filled: bool
    owner: _ThreadOwner


class _Slot:
    """A memo slot: ``key`` (what :meth:`TritonKernel._generate` remembers of a launch, a tuple
    ending in :data:`_TAIL` fields), ``blocks`` (an argument block per variant) and ``hits`` (hits
    since it was filled or last shared: :data:`PROMOTE_AFTER`)."""

    __slots__ = ("key", "blocks", "hits")

    key: tuple[Any, ...]
    blocks: list[Any]
    hits: int


#: the key's last fields: the launch function and its arguments (None until prebuilt), then
#: function, gx, gy, gz, bx, shmem, cu stream, params address (cuLaunchKernel's), the direct parts
_TAIL = 11


def _prepare(m: _Slot, k: tuple[Any, ...]) -> tuple[Any, ...]:
    """Slot ``m``'s launch ``k`` hit again: the key with the launch call's arguments built
    (``launch_call``), kept in the slot unless it was emptied meanwhile."""
    function, gx, gy, gz, bx, shmem, cu, addr, d = k[-9:]
    call = d.prepare(function, (gx, gy, gz), (bx, 1, 1), shmem, cu, addr)
    new = (*k[:-_TAIL], d.prepared, call, *k[-9:])
    if m.key is k:
        m.key = new
    return new


def _failed(parts: tuple[Any, ...], result: Any) -> None:
    """A remembered launch failed: the plan's named error (``parts``: the key's last 9 fields,
    function .. the direct parts)."""
    _, gx, gy, gz, bx, _, _, _, d = parts
    d.failed(result, gx, gy, gz, bx, 1, 1)


def _scalar_kind(element_type: str | None) -> str:
    """How the direct path takes a scalar parameter: "int" (a Python int), "float" (a float or an
    int), else "other" (converted by the plan's ``run``, by the ABI's rules)."""
    if element_type is None or element_type in ("bool", "bfloat16") or element_type not in abi.SCALARS:
        return "other"
    family = abi.SCALARS[element_type].family
    return "int" if family in ("int", "uint") else "float" if family == "float" else "other"


def _extras(facts: Any) -> tuple[int, int, int] | None:
    """What a Triton entry's launch needs beyond a plain one: (CTAs per program, global and profile
    scratch bytes per CTA), or None when it needs neither clusters nor scratch."""
    g, p = getattr(facts, "global_scratch", None), getattr(facts, "profile_scratch", None)
    ctas = getattr(facts, "num_ctas", None)
    if ctas is None and g is None and p is None:
        return None
    return (ctas or 1, g.size if g is not None else 0, p.size if p is not None else 0)


#: a dtype key no accepted set holds (a tensor off the GPU, a freed buffer): the fast call goes slow
_BAD = object()
#: an argument the fast call was not given (its arguments have defaults: a short call gets the named error)
_MISSING = object()


def _torch_reader(a: Any, dev: int) -> tuple[int, Any]:
    """A torch tensor (read inline by the fast call): its dtype only on a CUDA device ``dev``."""
    return a.data_ptr(), (a.dtype if a.is_cuda and a.get_device() == dev else _BAD)


def _data_ptr_reader(a: Any, dev: int) -> tuple[int, Any]:
    """Another type with torch's ``data_ptr()`` (its device, where the interop registry knows it)."""
    on = device_of(a)
    return a.data_ptr(), (a.dtype if getattr(a, "is_cuda", True) is not False and on in (None, dev) else _BAD)


def _buffer_reader(a: Any, dev: int) -> tuple[int, Any]:
    base = a._base
    live = a._et != FREED and (base is None or base._et != FREED) and getattr(a.backend_impl, "name", "cuda") == "cuda"
    return a.ptr, (a.dtype if live and a.device_id == dev else _BAD)


def _cupy_reader(a: Any, dev: int) -> tuple[int, Any]:
    on = device_of(a)
    return a.data.ptr, (getattr(a, "dtype", None) if on in (None, dev) else _BAD)


def _cai_reader(a: Any, dev: int) -> tuple[int, Any]:
    cai = a.__cuda_array_interface__
    return int(cai["data"][0]), _cai_dtype(a, cai)


def _cai_dtype(a: Any, cai: dict[str, Any]) -> Any:
    """The dtype of an array read through its ``__cuda_array_interface__``: its ``dtype``, else the
    interface's ``typestr`` (an object with the interface alone is checked too)."""
    dt = getattr(a, "dtype", None)
    return dt if dt is not None else cai.get("typestr")


def _reader_for(obj: Any) -> Callable[[Any, int], tuple[int, Any]] | None:
    """How the fast call reads a pointer of ``type(obj)`` (as :func:`device_pointer` does), or None."""
    if type(obj) is DeviceBuffer:
        return _buffer_reader
    if callable(getattr(obj, "data_ptr", None)):
        return _torch_reader if array_type(obj).name == "torch.Tensor" and callable(getattr(obj, "get_device", None)) \
            else _data_ptr_reader
    if type(getattr(getattr(obj, "data", None), "ptr", None)) is int and hasattr(obj, "__cuda_array_interface__"):
        return _cupy_reader
    if isinstance(getattr(obj, "__cuda_array_interface__", None), dict):
        return _cai_reader
    return None


#: Triton pointee -> the dtype names an array of it has (torch's without ``torch.``, NumPy's / CuPy's)
_DTYPE_NAMES = {"fp16": ("float16", "half"), "bf16": ("bfloat16",), "fp32": ("float32", "float"),
                "fp64": ("float64", "double"), "i8": ("int8",), "i16": ("int16", "short"), "i32": ("int32", "int"),
                "i64": ("int64", "long"), "u8": ("uint8",), "u16": ("uint16",), "u32": ("uint32",),
                "u64": ("uint64",), "i1": ("bool",),
                # torch's float8_e4m3fn / float8_e5m2 (ml_dtypes' NumPy dtypes and DLPack codes 10 / 12
                # are named so too), and the __cuda_array_interface__ typestrs ml_dtypes gives them
                "fp8e4nv": ("float8_e4m3fn", "|V1"), "fp8e5": ("float8_e5m2", "|f1")}
#: a dtype object -> its name (torch's without ``torch.``): one str() per dtype, not per call
_dtype_names: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = _name_of(dtype)
    return name


def _name_of(dtype: Any) -> str:
    """A dtype's name as :data:`_DTYPE_NAMES` spells it: torch's without ``torch.``, NumPy's (ml_dtypes'
    float8 types too), a DLPack ``(code, bits, lanes)``'s, a ``__cuda_array_interface__`` typestr's
    (a one-byte one with ``|`` for its byte order: it has none)."""
    if type(dtype) is tuple:
        return dtype_info(dtype)[0]
    if type(dtype) is str and dtype[:1] in ("<", ">", "|", "="):
        if dtype[2:] == "1":
            return "|" + dtype[1:]
        return dtype_info(dtype)[0]
    return str(dtype).removeprefix("torch.")


class TritonKernel:
    """The entries of one Triton instance family (the instance as written and its ``__base`` twin),
    launched as Triton launches a kernel. ``name`` and ``crate`` as a :class:`Kernel` has them;
    ``variants`` the entries' kernels, most specialised first."""

    def __init__(self, name: str, crate: str, variants: list[Any],
                 jit_checks: frozenset[tuple[str, str]] | None = None) -> None:
        """``jit_checks``: the assumptions (argument name, ``"16"`` or ``"1"``) Triton's JIT would make
        of the kernel's arguments where they hold (not of a ``do_not_specialize`` one): a call then
        launches the variant making exactly those that hold, when built, before the most specialised.

        The rest of the family's state is made at its first use (:meth:`__getattr__`): a package of
        many families loads without it."""
        self.name = name
        self.crate = crate
        self._init_args = (variants, jit_checks)
        if os.environ.get(CONFIG_VAR, "").strip():  # a pin is checked when the package loads
            self._fast  # noqa: B018

    def __getattr__(self, attr: str) -> Any:
        """An attribute of the family's state, made now (:meth:`_setup`) if it was not yet."""
        if attr.startswith("__"):
            raise AttributeError(attr)
        d = self.__dict__
        with _SETUP_LOCK:
            args = d.pop("_init_args", None)
            if args is not None:
                try:
                    self._setup(*args)
                except BaseException:
                    d["_init_args"] = args
                    raise
        try:
            return d[attr]
        except KeyError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}") from None

    def _setup(self, variants: list[Any], jit_checks: frozenset[tuple[str, str]] | None) -> None:
        name, crate = self.name, self.crate
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
        #: the bits of the checks the JIT makes (None: every check; a variant then is preferred by its count)
        self._jit_mask = None if jit_checks is None else sum(
            1 << i for i, (arg, what) in enumerate(checks) if (self.arg_names[arg], what) in jit_checks)
        self._pointers = tuple(i for i, p in enumerate(self._pointer) if p)
        self._count = len(self.types)
        #: assumption bits -> (the variant's launch, its dynamic shared memory, the variant, the indexes of
        #: the values it takes, or None for all of them: a variant assuming an argument 1 does not take it)
        self._chosen: dict[Any, tuple[Any, int, Any, tuple[int, ...] | None]] = {}
        #: the fast call's state (:meth:`_generate`): per pointer argument, type -> reader and the dtypes
        #: seen accepted; assumption bits -> (the variant's plans by device, its shared memory, block, index)
        self._readers: dict[int, dict[type, Callable[[Any, int], tuple[int, Any]]]] = {i: {} for i in self._pointers}
        self._dtypes: dict[int, set[Any]] = {i: set() for i in self._pointers}
        self._fast_chosen: dict[Any, tuple[Any, ...]] = {}
        #: per variant, device -> its plan's direct launch parts (``LaunchPlan.direct``), False for none
        self._directs: list[dict[int, Any]] = [{} for _ in self.variants]
        #: per argument, how the direct path takes it when a scalar (:func:`_scalar_kind`)
        params = {p.name: p for k in self.variants for p in k.entry.params}
        self._scalar_kind = tuple("pointer" if self._pointer[i] else
                                  _scalar_kind(getattr(params.get(nm), "element_type", None))
                                  for i, nm in enumerate(self.arg_names))
        #: the integer scalars (an integral value of another type is read as its int: ``abi.integral``)
        self._ints = tuple(i for i, t in enumerate(self.types) if not self._pointer[i]
                           and t.partition(":")[0] in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"))
        #: the memo slots (:meth:`_new_slots`): a slot's key, a tuple (:meth:`_generate`), is
        #: ``EMPTY`` when it holds no launch
        n = len(self.types)
        self._key_len = n + 2 + len(self._pointers) + 2 + 8 + 1
        self._empty = (NOMEMO,) * self._key_len
        self._tls = threading.local()
        #: per variant, its clusters and scratch (:func:`_extras`), None for a plain launch
        self._extras = tuple(_extras(k.entry.triton) for k in self.variants)
        #: the shared snapshots, newest first (:meth:`_promote`): a slot's key with the launch call
        #: prebuilt over a copy of its block that nothing writes again, then that copy; read by any
        #: thread with no thread-local look-up; each bump_epoch() empties them
        self._shared: list[tuple[Any, ...]] = [self._empty] * SLOTS
        for j in range(SLOTS):
            register_memo(self._shared, j, self._empty)
        #: the backends of the DeviceBuffers seen accepted (CUDA's): the fast call reads those inline
        self._backends: set[Any] = set()
        #: pointer types whose address never moves (DeviceBuffer views, CuPy arrays): the memo keeps them
        self._fixed: set[type] = set()
        self._source = ""
        #: ``check(*args)`` before every launch, ``bind`` and ``chosen`` (set before the first call): the
        #: family's kernel's @triton.heuristics computing its constexprs (:func:`khal_runtime.triton_call.heuristic_check`)
        self.__dict__.setdefault("heuristic_check", None)
        self.heuristic_check: Callable[..., None] | None
        #: ``launch(grid, *args, stream=None)``: generated over khal Kernels at the first call (nothing
        #: is generated when a package loads), else the slow path
        self._fast: Callable[..., None] | None = None
        self.launch: Callable[..., None] = self._launch_slow
        #: grid -> ``functools.partial(self.launch, grid)`` (:meth:`__getitem__`)
        self._grids: dict[Any, Callable[..., None]] = {}
        #: an autotuned family (``autotune = true``): its variants' configs, the indexes of the autotuner's
        #: key arguments (a choice per their values), the rule or pin, and the choices made (key -> config)
        self.tuned = getattr(facts, "config", None) is not None
        self.configs: dict[int, dict[str, Any]] = {}
        self._key_args: tuple[int, ...] = ()
        self._rule: int | None = None
        self._pin: int | None = None
        self.choices: dict[tuple[Any, ...], int] = {}
        if self.tuned:
            for k in self.variants:
                t = k.entry.triton
                self.configs.setdefault(t.config, {"constexprs": dict(t.constexprs), "num_warps": t.num_warps,
                                                   "num_stages": t.num_stages})
            self.configs = dict(sorted(self.configs.items()))
            self._key_args = tuple(self.arg_names.index(n) for n in facts.autotune_key if n in self.arg_names)
            self._rule = facts.choose
            self._pin = _env_pin(crate, name, tuple(self.configs))
        # over khal Kernels (what the generated call reads of them: their plans by device, block, crate)
        self._can_fast = all(hasattr(k, "_plans") and hasattr(k, "block_size") and hasattr(k, "_crate") for k in self.variants)
        if self._can_fast:
            self.launch = self._first_launch

    def _first_launch(self, grid: Any, *args: Any, stream: Any = None) -> None:
        """``launch`` until the first call: the fast call generated, then called."""
        self._ensure_fast()
        self.launch(grid, *args, stream=stream)

    def _ensure_fast(self) -> Callable[..., None] | None:
        """The generated call (:meth:`_generate`), made at the first use of the family."""
        fast = self._fast
        if fast is None and self._can_fast:
            # generated at the first call, not when the package loads (~15 ms a family, #38 item 18);
            # the launchers ``k[grid]`` made before it are dropped
            self.launch = self._fast = fast = self._generate()
            self._grids.clear()
        return fast

    @property
    def source(self) -> str:
        """The generated call's Python (made now when the family was not called yet)."""
        self._ensure_fast()
        return self._source

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
        masks = self._masks
        if self._jit_mask is not None:  # the variant with exactly the JIT's assumptions, when built
            want = bits & self._jit_mask
            masks = sorted(masks, key=lambda mk: mk[0] != want)
        for mask, k in masks:
            if mask & bits == mask:
                ones = set(k.entry.triton.ones)
                keep = None if not ones else tuple(i for i in range(self._count + 2)
                                                   if i >= self._count or self.arg_names[i] not in ones)
                self._chosen[bits] = (k.launch, k.entry.triton.shared, k, keep)
                return self._chosen[bits]
        raise self._broken(bits, values)

    def _broken(self, bits: int, values: list[Any]) -> TritonAssumptionError:
        """The error of a call whose assumption ``bits`` no variant's assumptions fit."""
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
        return TritonAssumptionError(
            f"{self.name}: every binary the crate ships assumes what this call breaks: {'; '.join(broken)} "
            "(build the instance with its conservative twin: leave 'fallback' on)")

    # -- autotuned families ----------------------------------------------------------------------------

    def _variant_choice(self, k: Any) -> tuple[Any, int, Any, tuple[int, ...] | None]:
        ones = set(k.entry.triton.ones)
        keep = None if not ones else tuple(i for i in range(self._count + 2)
                                           if i >= self._count or self.arg_names[i] not in ones)
        return (k.launch, k.entry.triton.shared, k, keep)

    def _candidates(self, bits: int, values: list[Any]) -> dict[int, Any]:
        """Per config, its most specialised variant whose assumptions ``bits`` hold."""
        out: dict[int, Any] = {}
        masks = self._masks
        if self._jit_mask is not None:  # per config, the variant with exactly the JIT's assumptions first
            want = bits & self._jit_mask
            masks = sorted(masks, key=lambda mk: mk[0] != want)
        for mask, k in masks:
            c = k.entry.triton.config
            if c not in out and mask & bits == mask:
                out[c] = k
        if not out:
            raise self._broken(bits, values)
        return out

    def _key(self, bits: int, values: list[Any]) -> tuple[Any, ...]:
        """The cache key of an autotuned call: its assumption bits, then the values of the autotuner's
        key arguments (the dtypes, Triton's other part of the key, are the family's own)."""
        key = (bits, *(values[i] for i in self._key_args))
        try:
            hash(key)
        except TypeError:
            raise ArgumentError(f"{self.name}(): an argument of the autotune key "
                                f"({', '.join(self.arg_names[i] for i in self._key_args)}) is not a number") from None
        return key

    def _config_for(self, key: tuple[Any, ...], cands: dict[int, Any], grid: Any, values: list[Any],
                    stream: Any) -> int:
        """The config of an autotuned call: the pin, the crate's rule, the one chosen before for these
        key values, the only one, else the fastest of ``cands`` timed now on the call's stream."""
        rule = self._pin if self._pin is not None else self._rule
        if rule is not None:
            if rule not in cands:
                raise TritonAssumptionError(
                    f"{self.name}: config {rule} ({'pinned' if self._pin is not None else 'the crate rule'}) has no "
                    f"variant whose assumptions this call meets (configs that fit: {sorted(cands)})")
            return rule
        known = self.choices.get(key[1:])
        if known is not None and known in cands:
            return known
        if len(cands) == 1:
            return int(next(iter(cands)))
        if type(stream) is Stream:
            st = stream
        elif stream is None:
            st = _tls.__dict__.get("stream") or default_stream()
        else:
            st = as_stream(stream)
        if capture_state.capturing(st):
            raise CaptureError(
                f"{self.name}: autotuned, and no config is chosen yet for {self._key_text(key)}: choosing times "
                f"its {len(cands)} configs on the GPU, which a graph capture cannot hold. Call it once with these "
                f"key values before capturing (a warm-up, as torch.cuda.graph asks), or pin a config (the instance's "
                f"'choose', {CONFIG_VAR}, or k.pin(n))")
        best = self._time(cands, grid, values, st)
        self.choices[key[1:]] = best
        return best

    def _key_text(self, key: tuple[Any, ...]) -> str:
        return ", ".join(f"{self.arg_names[i]}={v!r}" for i, v in zip(self._key_args, key[1:])) or "its call"

    def _time(self, cands: dict[int, Any], grid: Any, values: list[Any], st: Any) -> int:
        """The config of ``cands`` whose launches take the least GPU time on ``st``, measured by the
        backend's timer (CUDA events: what the profiler uses), on the call's own arguments. A config
        whose warm-up launch is refused (a named khal error: more resources than the device has) is
        left out, as Triton's autotuner leaves out one that runs out of resources."""
        timer = st.backend_impl.timer()
        runs = []
        for c, k in cands.items():
            launch, shmem, _, keep = self._variant_choice(k)
            g = grid(k.entry.triton.constexprs) if callable(grid) else grid
            if type(g) in (tuple, list) and len(g) == 1:
                g = g[0]
            vals = values if keep is None else [values[i] for i in keep]
            if _extras(k.entry.triton) is not None:
                runs.append((c, functools.partial(self._launch_variant, k, g, vals, st, shmem)))
            else:
                runs.append((c, functools.partial(launch, g, None, *vals, stream=st, shared_mem=shmem)))
        if timer is None:  # a backend that times nothing: the first config, as a rule would
            return runs[0][0]
        refused: list[KhalError] = []
        for c, run in list(runs):
            try:
                run()  # warm-up: loads the module, the first launch's costs
            except KhalError as exc:  # this config cannot launch here (more shared memory than the device has)
                refused.append(exc)
                runs.remove((c, run))
        if not runs:
            raise refused[0]
        best: dict[int, float] = {}
        for _ in range(TUNE_ROUNDS):
            for c, run in runs:
                start = timer.start(st)
                for _ in range(TUNE_LAUNCHES):
                    run()
                ms = timer.elapsed_ms(timer.stop(start, st), True)
                if ms is not None and ms >= 0:
                    best[c] = min(best.get(c, ms), ms)
        return min(best, key=lambda c: (best[c], c)) if best else runs[0][0]

    def _tuned_choice(self, bits: int, values: list[Any], grid: Any, stream: Any
                      ) -> tuple[tuple[Any, ...], tuple[Any, int, Any, tuple[int, ...] | None]]:
        key = self._key(bits, values)
        chosen = self._chosen.get(key)
        if chosen is None:
            cands = self._candidates(bits, values)
            chosen = self._variant_choice(cands[self._config_for(key, cands, grid, values, stream)])
            self._chosen[key] = chosen
        return key, chosen

    def _known_choice(self, args: tuple[Any, ...], what: str, device: int | None = None
                      ) -> tuple[list[Any], tuple[Any, int, Any, tuple[int, ...] | None]]:
        """The variant a call with ``args`` launches, with no launch and no timing (``bind``, ``chosen``;
        ``device``: the launch's, whose arrays' devices are checked)."""
        values = self._values(args, device)
        bits = self._bits(values)
        if not self.tuned:
            return values, self._chosen.get(bits) or self._choose(bits, values)
        key = self._key(bits, values)
        chosen = self._chosen.get(key)
        if chosen is not None:
            return values, chosen
        cands = self._candidates(bits, values)
        rule = self._pin if self._pin is not None else self._rule
        known = rule if rule is not None else self.choices.get(key[1:])
        if known is None and len(cands) == 1:
            known = next(iter(cands))
        if known is None or known not in cands:
            raise TritonAutotuneError(
                f"{self.name}.{what}: autotuned, and no config is chosen yet for {self._key_text(key)}: call it once "
                f"with these key values first (the first call times the configs), or pin one (k.pin(n))")
        return values, self._variant_choice(cands[known])

    def pin(self, config: int | None) -> None:
        """Launch config ``config`` of this autotuned family from now on, for every key (no timing);
        None: back to the crate's rule or timing. Choices already made stay in ``choices``."""
        if not self.tuned:
            raise TritonAutotuneError(f"{self.name}: not an autotuned family (its instance has no autotune = true)")
        if config is not None and config not in self.configs:
            raise TritonAutotuneError(f"{self.name}.pin({config!r}): its configs are {sorted(self.configs)}")
        self._pin = config
        self._chosen.clear()
        self._fast_chosen.clear()
        bump_epoch()  # every remembered launch goes: the next call chooses again

    def may_write(self, i: int) -> bool:
        """Whether some variant of the family may write through pointer argument ``i``: True unless
        the build proved, for every variant, that its kernel only reads it
        (:attr:`khal_runtime.manifest.TritonFacts.written`; a variant without the field may write all)."""
        n = self.arg_names[i]
        return any(k.entry.triton.may_write(n) for k in self.variants)

    def pointee_dtype(self, i: int) -> str | None:
        """The dtype name an array passed as pointer argument ``i`` must have (``*fp32``:
        ``"float32"``, ``*fp8e4nv``: ``"float8_e4m3fn"``, torch's spelling without ``torch.``), None
        for a pointee the family knows no dtype of. Every variant of a family takes the same types."""
        names = _DTYPE_NAMES.get(self.types[i][1:])
        return names[0] if names is not None else None

    def check_dtype(self, i: int, dtype: Any) -> None:
        """Refuse an array of ``dtype`` as pointer argument ``i`` (the family's ArgumentError)."""
        names = _DTYPE_NAMES.get(self.types[i][1:])
        if dtype is not None and names is not None and _dtype_name(dtype) not in names:
            raise ArgumentError(
                f"{self.name}(): argument {self.arg_names[i]!r} is an array of {_dtype_name(dtype)}, "
                f"the kernel was built for {self.types[i]} ({names[0]}): build an instance for it "
                "(a 'matrix' over the type)")

    def _pointer_of(self, i: int, a: Any, device: int | None) -> int:
        """Argument ``i`` (a pointer, not an int) as a device address, its dtype checked (an array
        with ``__cuda_array_interface__`` and no ``dtype``: its typestr), and, for a launch on
        ``device``, its device where the array's type says it (as the CUDA C++ call refuses one)."""
        dtype = getattr(a, "dtype", None)
        if dtype is None:
            cai = getattr(a, "__cuda_array_interface__", None)
            if isinstance(cai, dict):
                dtype = cai.get("typestr")
        self.check_dtype(i, dtype)
        if device is not None and type(a) is not int:
            on = device_of(a)
            if on is not None and on != device:
                raise ArgumentValueError(
                    f"{self.name}(): argument {self.arg_names[i]!r} is on device {on}, the launch is on device "
                    f"{device}: move it there, or launch on a stream of device {on}")
        return device_pointer(a, f"{self.name}(): argument {self.arg_names[i]!r}")

    def _values(self, args: tuple[Any, ...], device: int | None = None) -> list[Any]:
        """The kernel's parameters: ``args`` with pointers as addresses, integral scalars (NumPy,
        ``IntEnum``, a 0-d integer tensor) as ints, then the two null scratch pointers; each pointer
        checked against its elements' size and, for a launch on ``device``, its device."""
        if len(args) != self._count:
            raise ArgumentError(f"{self.name}() takes {len(self.types)} argument(s) "
                                f"({', '.join(self.arg_names)}), got {len(args)}")
        out = [*args, 0, 0]
        for i in self._ints:
            if type(out[i]) is not int:
                out[i] = abi.integral(out[i])
        for i in self._pointers:
            a = out[i]
            if type(a) is not int:
                addr = _int_address(a)
                out[i] = addr if addr is not None else self._pointer_of(i, a, device)
        for i, mask in self._align:
            if out[i] & mask:
                raise ArgumentValueError(
                    f"{self.name}(): argument {self.arg_names[i]!r} ({self.types[i]}) points at {out[i]:#x}, not a "
                    f"multiple of {mask + 1} bytes (its elements' size): the kernel's loads would fault")
        return out

    def _launch_slow(self, grid: Any, *args: Any, stream: Any = None) -> None:
        """A launch through :meth:`Kernel.launch` with every check; what it accepted (the types and
        dtypes of the pointers, the variant of the assumption bits) the fast call takes from then on.
        With no ``stream=``, a call given torch tensors launches on PyTorch's current stream of their device.
        An empty grid (a 0 in it, ``cdiv(0, BLOCK)``) launches nothing, after the arguments' checks
        (no variant is chosen: nothing runs, so nothing is assumed)."""
        if any(a is _MISSING for a in args):  # (a short call through the generated one)
            args = tuple(a for a in args if a is not _MISSING)
        if self.heuristic_check is not None:
            self.heuristic_check(*args)
        if stream is None:
            stream = self._torch_stream(args)
        values = self._values(args, _device_for(stream))
        if self._no_programs(grid):
            return
        bits = 0
        for bit, arg in self._bits16:
            v = values[arg]
            if type(v) is int and not v & 15:
                bits |= bit
        if self._bits1:
            bits = self._bits(values)
        key: Any = bits
        if self.tuned:
            key, chosen = self._tuned_choice(bits, values, grid, stream)
        else:
            got = self._chosen.get(bits)
            chosen = got if got is not None else self._choose(bits, values)
        if type(grid) is not int:
            if callable(grid):
                grid = grid(chosen[2].entry.triton.constexprs if self.tuned else self.constexprs)
                if self.tuned and is_empty(grid3(grid, f"{self.name}[grid]: grid")):
                    return  # (empty with the config chosen)
            if type(grid) in (tuple, list) and len(grid) == 1:
                grid = grid[0]
        keep = chosen[3]
        if keep is not None:
            values = [values[i] for i in keep]
        if _extras(chosen[2].entry.triton) is not None:
            self._launch_variant(chosen[2], grid, values, stream, chosen[1])
        else:
            chosen[0](grid, None, *values, stream=stream, shared_mem=chosen[1])
        if self._fast is not None:
            self._learn(key, chosen, args)

    def _torch_stream(self, args: tuple[Any, ...]) -> Any:
        """PyTorch's current stream of the device of the first pointer argument, when it is a torch
        tensor on a CUDA device (Triton's launcher launches there); else None (this thread's stream)."""
        for i in self._pointers:
            if i < len(args) and is_torch_tensor(args[i]):
                return torch_stream(args[i])
            break
        return None

    def _no_programs(self, grid: Any) -> bool:
        """Whether ``grid`` (an int, up to three, or a callable of the constexprs) has no programs,
        read with the family's named errors (a negative or non-integer grid). A callable grid of an
        autotuned family is empty when it is so with every config's constexprs (an empty launch is
        not timed)."""
        what = f"{self.name}[grid]: grid"
        if type(grid) is int:
            return is_empty(grid3(grid, what))
        if not callable(grid):
            g = grid[0] if type(grid) in (tuple, list) and len(grid) == 1 else grid
            return is_empty(grid3(g, what))
        metas = [c["constexprs"] for c in self.configs.values()] if self.tuned else [self.constexprs]
        for meta in metas:
            g = grid(meta)
            if type(g) in (tuple, list) and len(g) == 1:
                g = g[0]
            if not is_empty(grid3(g, what)):
                return False
        return True

    def _launch_variant(self, k: Any, grid: Any, values: list[Any], stream: Any, shmem: int) -> None:
        """Launch variant ``k`` (an entry with clusters or scratch memory, :func:`_extras`) over
        ``grid`` programs through its Kernel's launch: ``num_ctas`` blocks per program along x, and
        the scratch pointers (the last two of ``values``) to the stream's scratch memory for that
        many programs (:func:`khal_runtime.scratch.pointer`)."""
        ex = _extras(k.entry.triton)
        assert ex is not None
        ctas, gsize, psize = ex
        gx, gy, gz = grid3(grid, f"{self.name}[grid]: grid")
        if not (gx and gy and gz):
            return
        st = as_stream(stream)
        values = list(values)
        programs = gx * gy * gz * ctas
        values[-2], values[-1], _ = scratch.pointers(st, programs * gsize, programs * psize,
                                                     f"{self.name} ({k.entry.name})")
        k.launch((gx * ctas, gy, gz), None, *values, stream=st, shared_mem=shmem)

    def _learn(self, bits: Any, chosen: tuple[Any, int, Any, tuple[int, ...] | None], args: tuple[Any, ...]) -> None:
        """After a launch the slow path checked: let the fast call take these pointer types and
        dtypes, and these assumption bits (of an autotuned family: these bits and key values)."""
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
                self._backends.add(a.backend_impl)  # a CUDA one: the slow path read its __cuda_array_interface__
            if type(a) is DeviceBuffer or (reader is _cupy_reader and type(a).__module__.startswith("cupy")):
                self._fixed.add(type(a))
        k = chosen[2]
        which = self.variants.index(k)
        directs = self._directs[which]
        for dev, plan in list(k._plans.items()):
            if dev not in directs:
                parts = plan.direct()  # (LaunchPlan.direct: None where the backend has no direct path)
                # (a plain tuple: the generated call unpacks it)
                directs[dev] = (parts.function, parts.pack, parts.new_block, parts.launch, parts.failed, parts) \
                    if parts is not None else False
        if self.tuned:
            self._fast_chosen[bits] = (k._plans, chosen[1], k.block_size[0], which, directs, k.entry.triton.constexprs)
        else:
            self._fast_chosen[bits] = (k._plans, chosen[1], k.block_size[0], which, directs)

    def _new_slots(self) -> _ThreadSlots:
        """This thread's memo slots of the family (:meth:`_generate`): ``SLOTS`` of them, each
        with an argument block per variant (made at its first use), registered with
        :func:`khal_runtime.memo.register_memo` under an owner only this thread's storage holds
        (a slot's ``key`` says what it holds: every ``bump_epoch`` empties it)."""
        owner = _ThreadOwner()
        slots = []
        for _ in range(SLOTS):
            m = _Slot()
            m.key, m.blocks, m.hits = self._empty, [None] * len(self.variants), 0
            register_memo(m, "key", self._empty, owner=owner)
            slots.append(m)
        ms = _ThreadSlots()
        ms.all = tuple(slots)
        for j, m in enumerate(slots):
            setattr(ms, f"s{j}", m)
        ms.victim, ms.filled, ms.owner = 0, False, owner
        self._tls.s = ms
        return ms

    def _promote(self, m: _Slot, k: tuple[Any, ...]) -> tuple[Any, ...]:
        """Slot ``m``'s launch ``k`` hit :data:`PROMOTE_AFTER` times: make it the newest shared
        snapshot (its block copied, never written again, and the launch call built over the copy;
        the oldest snapshot goes). Returns the slot's key, its own launch call prepared."""
        ep = EPOCH[0]
        f = self._key_len - _TAIL
        if k[f] is None:
            k = _prepare(m, k)
        function, gx, gy, gz, bx, shmem, cu, addr, d = k[f + 2:]
        blk = next((b for b in m.blocks if b is not None and b[2] == addr), None)
        if blk is None:  # (an entry without parameters: nothing to copy, nothing to share)
            return k
        copy = d.new_block()
        ctypes.memmove(copy[0], blk[0], len(blk[0]))
        call = d.prepare(function, (gx, gy, gz), (bx, 1, 1), shmem, cu, copy[2])
        snap = (*k[:f], d.prepared, call, function, gx, gy, gz, bx, shmem, cu, copy[2], d, copy)
        if m.key is k and EPOCH[0] == ep:  # still remembered: nothing freed meanwhile
            shared = self._shared
            shared[:] = [snap, *shared[:SLOTS - 1]]
        return k

    def _generate(self) -> Callable[..., None]:
        """The fast call ``launch(grid, a0, ..., stream=None)`` of this family (:mod:`khal_runtime.generated`).

        1. A repeat: this thread's memo slots (the last ``SLOTS`` distinct launches it made on
           the direct path), each holding the argument objects, the grid object (an int or a
           tuple: a callable grid is evaluated on every call) and the stream, and the packed block
           of the variant chosen. A slot whose objects are all these ones (``is``), each pointer
           read by ``data_ptr()`` still at the address packed (an int, a DeviceBuffer, a view of
           one or a CuPy array cannot move; a freed DeviceBuffer clears every slot: ``memo.EPOCH``) launches
           its block as it is (with the launch call's arguments built at its first hit and kept,
           :func:`khal_runtime.backends.cuda.launch.launch_call`): no read, check, choice or pack.
        2. Else the full read: pointers read by a reader per type, alignment and assumption bits
           inline, the variant by the bits, the grid checked, and the values packed into the least
           recently filled slot's block for that variant and launched (the plan's
           :meth:`~khal_runtime.backends.cuda.launch.LaunchPlan.direct` parts); the slot then
           remembers the launch when every argument is of a kind it can recheck (above). Scalars
           other than Python ints and floats, entries with launch attributes, and launches while
           launch hooks are installed (tracing, profiling) go through the variant's plan's ``run``.

        Anything the slow path has not accepted (a new pointer type or dtype, new bits, another
        device, a stream object other than a Stream, a value out of range) goes to
        :meth:`_launch_slow`, which raises the named error or launches and teaches this call."""
        n = self._count
        names = [f"a{i}" for i in range(n)]
        allargs = ", ".join(names)
        slow = f"return slow(grid, {allargs + ', ' if n else ''}stream=stream)"
        sig = "".join(f"{a}=MISSING, " for a in names)
        given = "(" + "".join(f"{a}, " for a in names) + ")"
        # with no stream=, a torch tensor as the first pointer: PyTorch's current stream of its device
        p0 = f"a{self._pointers[0]}" if self._pointers else None
        torch_st = [] if p0 is None else [
            f"    if stream is None and type({p0}) in TT:", f"        st = torch_stream({p0})",
            "        if st is None:", f"            {slow}", "        try:", "            cur = thread.dev",
            "        except AttributeError:", "            cur = -1", "        if cur != st.device_id:",
            f"            {slow}", "    elif stream is None:"]
        check = [] if self.heuristic_check is None else [f"    CHECK({allargs})"]
        L = [f"def launch(grid, {sig}*more, stream=None):", *check,
             *(torch_st or ["    if stream is None:"]), "        try:", "            st = thread.ready",
             "        except AttributeError:",
             "            st = None", "        if st is None:", "            if crate._backend is None:",
             f"                {slow}", "            st = ready_stream()",
             "    elif type(stream) is Stream:", "        st = stream", "        try:", "            cur = thread.dev",
             "        except AttributeError:", "            cur = -1", "        if cur != st.device_id:",
             f"            {slow}",
             "    else:", f"        {slow}"]
        # 1. the shared snapshots, then this thread's memo slots
        tls_read = ["    try:", "        ms = tls.s", "    except AttributeError:", "        ms = new_slots()"]
        P = len(self._pointers)  # noqa: N806
        F = n + 2 + P  # noqa: N806  (the key's launch function; then its arguments, then the _TAIL - 2 others)
        # the grid first: a callable one (new each call in Triton's idiom) fails every slot at once
        # an argument is the remembered object, or an int or float equal to a remembered one of its
        # type (``x.numel()``, ``t.data_ptr()`` and every number through torch's dispatcher are new
        # objects each call; equal ints pack alike, equal floats too unless one is -0.0; an int equal
        # to a float need not)
        conds = [f"({x} is k[{j}] or type({x}) in NUMBERS and type({x}) is type(k[{j}]) and {x} == k[{j}] "
                 f"and ({x} or str({x}) == str(k[{j}])))"
                 for j, x in enumerate(names)] + [f"st is k[{n + 1}]", "not more"]
        # (a tensor: the address and dtype packed; ``.data =`` a view of another dtype keeps the address)
        conds += [f"(k[{n + 2 + j}] is None or (a{i}.data_ptr(), a{i}.dtype) == k[{n + 2 + j}])"
                  for j, i in enumerate(self._pointers)]
        memo_line = len(L)  # (``k[grid]``'s closure over a callable grid skips the memo: it can hold none)
        L += ["    if not hooks.active:", "        try:"]
        for j in range(SLOTS):  # the snapshots, newest first (all empty when the first is)
            hit = " and ".join([f"grid is (k := snaps[{j}])[{n}]"] + conds)
            L += [f"            {'if' if j == 0 else 'elif'} {hit}:", "                pass"]
            if j == 0:
                L += ["            elif k[0] is NOMEMO:", "                k = None"]
        L += ["            else:", "                k = None",
              "        except Exception:",  # a remembered object whose pointer can no longer be read
              "            k = None",
              "        if k is not None:", f"            r = k[{F}](*k[{F + 1}])",
              "            if r[0]:", f"                failed(k[{F + 2}:{F + 11}], r[0])", "            return"]
        L += ["    " + line for line in tls_read]
        L += ["        try:"]
        for j in range(SLOTS):
            hit = " and ".join([f"grid is (k := (m := ms.s{j}).key)[{n}]"] + conds)
            L += [f"            {'if' if j == 0 else 'elif'} {hit}:", "                pass"]
            if j == 0:
                L += ["            elif not ms.filled:", "                k = None"]
        L += ["            else:", "                k = None",
              "        except Exception:",  # a remembered object whose pointer can no longer be read
              "            k = None",
              "        if k is not None:", "            h = m.hits + 1", f"            if h >= {PROMOTE_AFTER}:",
              "                m.hits = 0", "                k = promote(m, k)", "            else:",
              "                m.hits = h", f"            fn = k[{F}]", "            if fn is None:",
              "                k = prepare(m, k)", f"                fn = k[{F}]", f"            r = fn(*k[{F + 1}])",
              "            if r[0]:", f"                failed(k[{F + 2}:{F + 11}], r[0])", "            return",
              "    else:", "        ms = None"]
        # 2. the full read
        L += [f"    if more{f' or {names[-1]} is MISSING' if n else ''}:",
              f"        return slow(grid, *(a for a in {given} if a is not MISSING), *more, stream=stream)",
              "    if crate._backend is None:", f"        {slow}", "    ep = EPOCH[0]", "    dev = st.device_id"]
        align = dict(self._align)
        for i in range(n):
            if self._pointer[i]:
                L += [f"    t = type(a{i})", "    if t is int:", f"        v{i} = a{i}", f"        q{i} = None",
                      # a DeviceBuffer of a CUDA backend seen accepted, live, not a view: read inline
                      f"    elif t is DeviceBuffer and a{i}._base is None and a{i}._et != FREED and a{i}.backend_impl in BK "
                      f"and a{i}.dtype in D{i} and a{i}.device_id == dev:", f"        v{i} = a{i}.ptr",
                      f"        q{i} = None", "    else:",
                      f"        rd = R{i}.get(t)", "        if rd is TORCH:",  # _torch_reader's reads, inline
                      # (an array of another device: the slow path names it, as the CUDA C++ call does)
                      f"            if not a{i}.is_cuda or a{i}.get_device() != dev:", f"                {slow}",
                      f"            v{i} = a{i}.data_ptr()", f"            dt = a{i}.dtype",
                      f"            if dt not in D{i}:", f"                {slow}", f"            q{i} = (v{i}, dt)",
                      "        else:", "            if rd is None:",
                      f"                {slow}",
                      f"            v{i}, dt = rd(a{i}, dev)", f"            if dt not in D{i}:", f"                {slow}",
                      # what a slot can recheck: an address read again (data_ptr), or one that cannot move
                      f"            q{i} = None if t in FIXED or t in STABLE else (v{i}, dt) if rd is DATA_PTR else NOMEMO"]
                if i in align:
                    L += [f"    if v{i} & {align[i]}:", f"        {slow}"]
            elif i in self._ints:  # an integral value of another type (NumPy, IntEnum) as its int
                L += [f"    v{i} = a{i}", f"    if type(v{i}) is not int:", f"        v{i} = integral(v{i})",
                      f"        if type(v{i}) is not int:", f"            {slow}"]
            else:
                L.append(f"    v{i} = a{i}")
        L.append("    bits = 0")
        for i, (arg, what) in enumerate(self._checks):
            if what == "16":
                cond = f"not v{arg} & 15" if self._pointer[arg] else f"type(v{arg}) is int and not v{arg} & 15"
            else:
                cond = f"type(v{arg}) is int and v{arg} == 1"
            L += [f"    if {cond}:", f"        bits |= {1 << i}"]
        if self.tuned:  # the choice per assumption bits and the autotuner's key values (a number each)
            tkey = ", ".join(["bits", *(f"v{i}" for i in self._key_args)])
            L += ["    try:", f"        c = chosen.get(({tkey}))", "    except TypeError:", f"        {slow}",
                  "    if c is None:", f"        {slow}", "    plans, shmem, bx, which, directs, cx = c"]
        else:
            L += ["    c = chosen.get(bits)", "    if c is None:", f"        {slow}",
                  "    plans, shmem, bx, which, directs = c"]
        L += ["    d = directs.get(dev)",
              "    if d is None:", f"        {slow}",
              "    g = grid", "    if type(g) is tuple and len(g) == 1:", "        g = g[0]",
              "    if type(g) is not int:", "        if type(g) is not tuple:",
              "            if not callable(g):", f"                {slow}",
              f"            g = g({'cx' if self.tuned else 'constexprs'})",
              "            grid_memo = NOMEMO",  # a callable's result can change: evaluated on every call
              "        else:", "            grid_memo = grid",
              "        if type(g) is int:", "            gx = g", "            gy = gz = 1",
              "        elif type(g) is tuple and 0 < len(g) <= 3:",
              "            gx, gy, gz = (*g, 1, 1)[:3]", "            if type(gx) is not int or type(gy) is not int or "
              "type(gz) is not int or not (0 < gy <= 65535 and 0 < gz <= 65535):", f"                {slow}",
              "        else:", f"            {slow}", "    else:", "        gx = g", "        gy = gz = 1",
              "        grid_memo = grid",
              "    if not 0 < gx <= 2147483647:", f"        {slow}"]
        tail = "0, 0"
        if any(ex is not None for ex in self._extras):  # clusters / scratch memory (:meth:`_launch_variant`)
            # a launch whose scratch is a capture's (scap) is not remembered: an eager repeat must not reuse it
            L += ["    ex = EXTRAS[which]", "    if ex is not None:", "        ctas, gs, ps = ex",
                  "        progs = gx * gy * gz * ctas",
                  "        s0, s1, scap = scratch_ptrs(st, progs * gs, progs * ps, NAME)",
                  "        if scap:", "            grid_memo = NOMEMO",
                  "        gx = gx * ctas", "        if gx > 2147483647:", f"            {slow}",
                  "    else:", "        s0 = s1 = 0"]
            tail = "s0, s1"
        packs = []
        for k in self.variants:
            ones = set(k.entry.triton.ones)
            packs.append("".join(f"v{i}, " for i in range(n) if self.arg_names[i] not in ones) + tail)
        if len(set(packs)) == 1:  # every variant takes the same values (no "== 1" assumption)
            L += [f"    vals = ({packs[0]})"]
        else:
            for j, vals in enumerate(packs):
                L += [f"    {'if' if j == 0 else 'elif'} which == {j}:", f"        vals = ({vals})"]
        # scalars struct packs as they are (else the plan's run converts them by the ABI's rules)
        plain = [f"type(v{i}) is int" if self._scalar_kind[i] == "int" else
                 f"(type(v{i}) is float or type(v{i}) is int)" for i in range(n)
                 if not self._pointer[i] and self._scalar_kind[i] in ("int", "float")
                 and not (i in self._ints and self._scalar_kind[i] == "int")]  # (those are ints: above)
        direct = ["d is False", "hooks.active"]
        direct += [f"not {c}" for c in plain]
        if any(not self._pointer[i] and self._scalar_kind[i] not in ("int", "float") for i in range(n)):
            direct = ["True"]
        L += [f"    if {' or '.join(direct)}:",
              "        plans[dev].run(gx, gy, gz, bx, 1, 1, shmem, st, vals)", "        return",
              "    function, pack, new_block, launch, fail, parts = d", "    if ms is None:",
              *("    " + line for line in tls_read),
              "    v = ms.victim", f"    ms.victim = v + 1 if v < {SLOTS - 1} else 0", "    m = ms.all[v]",
              "    m.key = EMPTY", "    blk = m.blocks[which]", "    if blk is None:",
              "        blk = m.blocks[which] = new_block()", "    try:", "        pack(blk[0], 0, *vals)",
              "    except Exception:",  # out of range: the slow path names the argument
              f"        {slow}", "    cu = st.native", "    addr = blk[2]",
              "    r = launch(function, gx, gy, gz, bx, 1, 1, shmem, cu, addr, 0)", "    if r[0]:",
              "        fail(r[0], gx, gy, gz, bx, 1, 1)"]
        memo = ["grid_memo is not NOMEMO"] + [f"q{i} is not NOMEMO" for i in self._pointers]
        key = ", ".join([*names, "grid_memo", "st", *(f"q{i}" for i in self._pointers), "None", "None", "function",
                         "gx", "gy", "gz", "bx", "shmem", "cu", "addr", "parts"])
        L += [f"    if {' and '.join(memo)} and ep == EPOCH[0]:", f"        m.key = ({key})",
              "        m.hits = 0", "        ms.filled = True"]
        ns: dict[str, Any] = {"slow": self._launch_slow, "crate": self.variants[0]._crate, "chosen": self._fast_chosen,
                              "thread": _tls, "Stream": Stream, "constexprs": self.constexprs, "MISSING": _MISSING,
                              "DeviceBuffer": DeviceBuffer, "FREED": FREED, "BK": self._backends,
                              "ready_stream": ready_stream, "tls": self._tls, "new_slots": self._new_slots,
                              "hooks": hooks, "prepare": _prepare, "failed": _failed, "EPOCH": EPOCH,
                              "snaps": self._shared, "promote": self._promote,
                              "NOMEMO": NOMEMO, "NUMBERS": (int, float), "EMPTY": self._empty, "TORCH": _torch_reader, "DATA_PTR": _data_ptr_reader,
                              "STABLE": STABLE_ARRAY_TYPES,
                              "FIXED": self._fixed, "EXTRAS": self._extras, "scratch_ptrs": scratch.pointers,
                              "NAME": self.name, "TT": TORCH_TENSOR_TYPES, "torch_stream": torch_stream,
                              "CHECK": self.heuristic_check, "integral": abi.integral}
        for i in self._pointers:
            ns[f"R{i}"], ns[f"D{i}"] = self._readers[i], self._dtypes[i]
        # ``launch(grid, ...)``, and ``launch.make(grid)``: the same body as a closure over one grid
        # (``k[grid]``'s launcher; ``grid`` a free variable: no ``functools.partial`` layer per call)
        body = L[1:]
        body[memo_line - 1] = "    if memo and not hooks.active:"
        L += ["", "", "def make(grid):", "    memo = type(grid) is int or type(grid) is tuple",
              f"    def go({sig}*more, stream=None):", *("    " + line for line in body),
              "    return go", "", "", "launch.make = make", "del make"]
        self._source = "\n".join(L) + "\n"
        return define(self._source, f"triton {self.name}", ns, "launch")  # type: ignore[no-any-return]

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        """``k[grid](*args, stream=None)``, as a Triton kernel is called: the generated call as a
        closure over ``grid`` (:meth:`_generate`), else ``launch`` with the grid bound. The launcher
        of an int or tuple grid is kept (up to 64 of them): ``k[(n,)]`` in a loop makes no new
        object per call."""
        t = type(grid)
        if t is tuple or t is int:
            try:
                go = self._grids.get(grid)
            except TypeError:  # a tuple holding something unhashable: the launch names what is wrong
                return self._launcher(grid)
            if go is None:
                go = self._launcher(grid)
                if len(self._grids) < 64:
                    self._grids[grid] = go
            return go
        return self._launcher(grid)

    def _launcher(self, grid: Any) -> Callable[..., None]:
        fast = self._fast if self._fast is not None else self._ensure_fast()
        if fast is not None:
            return fast.make(grid)  # type: ignore[attr-defined,no-any-return]
        return functools.partial(self.launch, grid)

    def bind(self, *args: Any, stream: Any = None) -> TritonBound:
        """``b = k.bind(*args, stream=None)``, then ``b(grid)``: the arguments checked once (the
        variant chosen, as a call with them would), packed once, and each ``b(grid)`` launches at
        about the cost of a raw launch (a bound launch of the variant, :meth:`Kernel.bind`)."""
        if self.heuristic_check is not None:
            self.heuristic_check(*args)
        if stream is None:
            stream = self._torch_stream(args)
        device = _device_for(stream)
        values, chosen = self._known_choice(args, "bind()", device)
        keep = chosen[3]
        if keep is not None:
            values = [values[i] for i in keep]
        k = chosen[2]
        if _extras(k.entry.triton) is not None:
            return _TritonBoundExtras(self, k, values, as_stream(stream))  # type: ignore[return-value]
        return TritonBound(self, k, k.bind(*values, stream=stream), args, device)

    def chosen(self, *args: Any) -> str:
        """The entry a call with ``args`` would launch (no launch; of an autotuned family, the config
        chosen for their key values, the rule's or the pinned one)."""
        if self.heuristic_check is not None:
            self.heuristic_check(*args)
        return str(self._known_choice(args, "chosen()")[1][2].entry.name)


def _env_pin(crate: str, name: str, configs: tuple[int, ...]) -> int | None:
    """The config ``KHAL_TRITON_CONFIG`` pins for family ``name`` of ``crate`` (``name=N`` or
    ``crate.name=N``, comma separated), or None."""
    raw = os.environ.get(CONFIG_VAR, "").strip()
    if not raw:
        return None
    for item in raw.split(","):
        who, _, n = item.strip().partition("=")
        if who.strip() in (name, f"{crate}.{name}"):
            try:
                pin = int(n)
            except ValueError:
                pin = -1
            if pin not in configs:
                raise TritonAutotuneError(f"{CONFIG_VAR}={raw!r}: {item.strip()!r} does not name one of "
                                          f"{crate}.{name}'s configs ({', '.join(map(str, configs))})")
            return pin
    return None


class TritonBound(functools.partial):  # type: ignore[type-arg]
    """A bound launch of a Triton family (:meth:`TritonKernel.bind`): ``b(grid)``, a grid of programs
    (an int, up to three dims, or a callable of the constexprs), launched by the chosen variant's
    bound launch taken with a grid of blocks (:meth:`BoundLaunch.over_grid
    <khal_runtime.backends.cuda.bound.BoundLaunch.over_grid>`): ``b(grid)`` is that call itself
    (a ``functools.partial`` of it, called through C-level vectorcall), no frame of its own. The
    same grid object (an int or a tuple; an equal int) launches the blocks it gave before; a
    callable grid or a list is read on every call. After a free the arguments as given are
    checked again (a freed DeviceBuffer: the named error)."""

    __slots__ = ("family", "variant", "bound")

    family: TritonKernel
    variant: Any
    #: the variant's bound launch (:meth:`Kernel.bind`): it holds the packed block
    bound: Any

    def __new__(cls, family: TritonKernel, variant: Any, bound: Any, args: tuple[Any, ...] = (),
                device: int | None = None) -> TritonBound:
        grid_of = _grid_reader(family, variant)
        self = super().__new__(cls, bound.over_grid(grid_of, (lambda: family._values(args, device)) if args else None))
        self.family, self.variant, self.bound = family, variant, bound
        return self

    def __init__(self, family: TritonKernel, variant: Any, bound: Any, args: tuple[Any, ...] = (),
                 device: int | None = None) -> None:
        pass  # (set in __new__)

    def __reduce__(self) -> Any:
        raise TypeError("a TritonBound cannot be pickled: it holds device pointers; bind again")

    def __repr__(self) -> str:
        return f"<TritonBound {self.family.crate}.{self.family.name} -> {self.variant.entry.name}>"


def _grid_reader(family: TritonKernel, variant: Any) -> Callable[[Any], tuple[tuple[int, int, int], bool]]:
    """``grid_of(grid)`` of a bound launch of ``variant``: ``((gx, gy, gz), keep)``, the programs
    of a grid (an int, up to three dims, or a callable of the constexprs), checked (named errors);
    ``keep``: whether the same object again may launch the same programs (an int or a tuple; a
    callable or a list is read on every call)."""
    constexprs = variant.entry.triton.constexprs
    what = f"{family.name}[grid]: grid"

    def grid_of(grid: Any) -> tuple[tuple[int, int, int], bool]:  # (a 0 in it: the caller launches nothing)
        t = type(grid)
        g = grid(constexprs) if t is not int and t is not tuple and callable(grid) else grid
        if type(g) in (tuple, list) and len(g) == 1:
            g = g[0]
        gx, gy, gz = grid3(g, what)
        if gx > MAX_GRID[0] or gy > MAX_GRID[1] or gz > MAX_GRID[2]:
            raise ArgumentValueError(f"{what}: {(gx, gy, gz)} programs, more than a launch may have "
                                     f"{MAX_GRID}; split the work into several launches")
        return (gx, gy, gz), t is int or t is tuple

    return grid_of


class _TritonBoundExtras:
    """A bound launch of a variant with clusters or scratch memory (:func:`_extras`), what
    :meth:`TritonKernel.bind` returns for it in place of a :class:`TritonBound`: ``num_ctas``
    blocks per program, and the arguments bound again whenever the grid needs a scratch pointer
    other than the one packed (more memory than the stream's buffer held, a capture began or
    ended: :data:`khal_runtime.scratch.GENERATION`; after a launch into a capture, the next one
    looks again)."""

    __slots__ = ("family", "variant", "bound", "_bx", "_last", "_grid_of", "_values", "_stream", "_ctas",
                 "_sizes", "_packed", "_gen")

    def __init__(self, family: TritonKernel, variant: Any, values: list[Any], stream: Any) -> None:
        self.family, self.variant = family, variant
        #: the variant's bound launch with the scratch pointers ``_packed`` (None: not bound yet)
        self.bound: Any = None
        self._bx = int(variant.entry.block_size[0])
        #: (the last grid object, its thread counts): a repeated grid launches with the same counts
        self._last: tuple[Any, Any] = (NOMEMO, None)
        self._grid_of = _grid_reader(family, variant)
        ex = _extras(variant.entry.triton)
        assert ex is not None
        self._ctas, self._sizes = ex[0], ex[1:]
        self._values, self._stream = list(values), stream
        #: the scratch pointers the bound launch packed (None: not bound yet)
        self._packed: tuple[int, int] | None = None
        #: the scratch generation they are good for; None: look again at the next launch
        self._gen: int | None = None
        if not any(self._sizes):  # clusters only: bound once
            self.bound = variant.bind(*values, stream=stream)
            self._packed = (0, 0)

    def __reduce__(self) -> Any:
        raise TypeError("a TritonBound cannot be pickled: it holds device pointers; bind again")

    def __repr__(self) -> str:
        return f"<TritonBound {self.family.crate}.{self.family.name} -> {self.variant.entry.name}>"

    def __call__(self, grid: Any) -> None:
        last = self._last
        if grid is last[0] and (not any(self._sizes) or self._gen == scratch.GENERATION[0]):
            self.bound(last[1])
            return
        (gx, gy, gz), keep = self._grid_of(grid)
        if not (gx and gy and gz):  # an empty grid: nothing launched
            return
        if any(self._sizes):
            gen = scratch.GENERATION[0]
            programs = gx * gy * gz * self._ctas
            s0, s1, captured = scratch.pointers(self._stream, programs * self._sizes[0], programs * self._sizes[1],
                                                f"{self.family.name} ({self.variant.entry.name})")
            if self._packed != (s0, s1):
                self.bound = self.variant.bind(*self._values[:-2], s0, s1, stream=self._stream)
                self._packed = (s0, s1)
            self._gen = None if captured else gen
        counts = (gx * self._ctas * self._bx, gy, gz)
        self._last = (grid if keep else NOMEMO, counts)
        self.bound(counts)
