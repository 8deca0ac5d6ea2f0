"""A shader package's kernels as PyTorch custom operators, for ``torch.compile`` and CUDA graphs.

    import torch
    import khal_runtime.torch as khal_torch
    from example_shader_pkg import SaxpyParams, kernels

    ops = khal_torch.register(kernels)          # torch.ops.example_shader_pkg.<entry>
    params = khal_torch.uniform(ops.saxpy, SaxpyParams(a=2.0), "cuda")   # the struct's bytes, on the GPU
    torch.ops.example_shader_pkg.saxpy(n, x, y, params)   # eager, compiled or captured alike

:func:`register` defines one operator per entry with :func:`torch.library.custom_op`:
``(SymInt threads, <one argument per kernel parameter>) -> ()``. A storage is a ``Tensor``
(``Tensor(a!)`` and in ``mutates_args`` when the kernel may write it), a uniform is a ``Tensor``
holding the struct's bytes (made by :func:`uniform`), a scalar is an ``int`` / ``float`` /
``bool`` / ``complex`` by the family of its ABI type. Each operator has a fake implementation
(argument checks only: the kernels write their outputs in place and return nothing), so
``torch.compile(fullgraph=True)`` traces it; its real implementation launches on PyTorch's
current stream of the tensors' device, so it is ordered with the surrounding torch work and is
recorded by ``torch.cuda.graph``.

Loading a package registers nothing, and importing ``khal_runtime`` never imports torch: only
this module does, inside :func:`register` and :func:`uniform`. Registering is explicit and
idempotent. A generic-layer module: it reaches the CUDA backend only through the kernels' own
launch path (``stream=`` takes the raw handle PyTorch gives).
"""

from __future__ import annotations

import keyword
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from khal_runtime import abi, interop
from khal_runtime.arguments import struct_bytes as _struct_bytes
from khal_runtime.device import Stream
from khal_runtime.errors import ArgumentError, ArgumentValueError, BackendUnavailableError, CaptureError, KhalError
from khal_runtime.kernels import Kernel, KernelSet
from khal_runtime.manifest import Entry, Param

__all__ = ["CrateOps", "TorchOps", "register", "registered", "uniform"]

#: schema type of a scalar parameter, by the family of its ABI type (``int`` is ``SymInt`` so a
#: size computed under ``torch.compile(dynamic=True)`` passes without specialising)
_SCHEMA_SCALAR = {"int": "SymInt", "uint": "SymInt", "float": "float", "bool": "bool", "complex": "complex"}
#: namespaces PyTorch itself uses
_RESERVED = frozenset({"aten", "prim", "prims", "torch", "_", "inductor", "higher_order", "profiler",
                       "quantized", "_quantized", "mkldnn", "rngprims", "debugprims", "nvprims", "c10d",
                       "_c10d_functional", "_dtensor", "cuda", "onednn", "_test"})
#: element types whose torch dtype the runtime reads as is (complex and struct elements are
#: passed as a view of the tensor's bytes: see :class:`_Reinterpreted`)
_TORCH_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "bfloat16", "float32", "float64", "bool"}
_STREAMS_MAX = 256


# ---------------------------------------------------------------------------------------------
# what one operator is
# ---------------------------------------------------------------------------------------------
@dataclass
class _OpSpec:
    """One entry as one operator (everything but torch's own objects is computed without torch)."""

    namespace: str
    op_name: str
    crate: str
    entry: Entry
    kernel: Kernel
    #: the schema's argument names, in order: the thread count first, then one per parameter
    arg_names: tuple[str, ...]
    schema: str
    mutates: tuple[str, ...]
    #: index (in the parameter list) of the first tensor argument, None if the entry has none
    first_tensor: int | None
    #: parameter indices of storages passed as a view of the tensor's bytes
    reinterpret: tuple[int, ...]
    opdef: Any = None
    packet: Any = None

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.op_name}"

    @property
    def where(self) -> str:
        return f"torch.ops.{self.namespace}.{self.op_name}() (entry {self.crate}.{self.entry.name})"


def _valid_arg_name(torch: Any, name: str) -> bool:
    try:
        torch._C.parse_schema(f"khal_probe::p(Tensor {name}) -> ()")
    except RuntimeError:
        return False
    return True


@dataclass(frozen=True)
class _TorchReader:
    """How an operator takes an argument of one reader."""

    #: a Tensor in the schema (else the scalar's own type)
    tensor: bool
    #: a tensor of the parameter's element type: its dtype is checked, a writable one is mutated
    typed: bool
    #: a struct's bytes in a uint8 tensor (what :func:`uniform` makes)
    uniform: bool


_READERS: abi.ReaderTable[_TorchReader] = abi.ReaderTable("khal_runtime.torch", {
    "array": _TorchReader(tensor=True, typed=True, uniform=False),
    "struct": _TorchReader(tensor=True, typed=False, uniform=True),
    "value": _TorchReader(tensor=False, typed=False, uniform=False),
})


def _schema_type(p: Param) -> str:
    if _READERS.of(p.kind, "torch operator schema").tensor:
        return "Tensor"
    return _SCHEMA_SCALAR[abi.SCALARS[p.element_type].family]


def _spec(torch: Any, namespace: str, op_name: str, kernel: Kernel) -> _OpSpec:
    entry = kernel.entry
    taken = {p.name for p in entry.params}
    threads = next(n for n in ("threads", "khal_threads", "khal_threads_", "khal_threads__") if n not in taken)
    names = [threads]
    for p in entry.params:
        n = p.name
        while not _valid_arg_name(torch, n) or n in names:
            n += "_"
        names.append(n)
    parts = [f"SymInt {threads}"]
    mutates = []
    first = None
    reinterpret = []
    for i, (p, n) in enumerate(zip(entry.params, names[1:])):
        t = _schema_type(p)
        if t == "Tensor":
            first = i if first is None else first
            if _READERS.of(p.kind).typed:
                if p.element_type not in _TORCH_DTYPES:
                    reinterpret.append(i)
                if p.writable:
                    t = f"Tensor(a{i}!)"
                    mutates.append(n)
        parts.append(f"{t} {n}")
    return _OpSpec(namespace, op_name, kernel.crate, entry, kernel, tuple(names),
                   f"({', '.join(parts)}) -> ()", tuple(mutates), first, tuple(reinterpret))


def _sanitize(name: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return "_" + s if s[:1].isdigit() else s


def _namespace(name: str, given: bool) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"namespace must be a non-empty str, got {name!r}")
    ns = name if given else _sanitize(name)
    if not ns.isidentifier() or keyword.iskeyword(ns) or not ns.isascii():
        raise ValueError(f"namespace {ns!r} is not a Python identifier: torch.ops.<namespace> must be "
                         "one; pass namespace='my_kernels'")
    if ns in _RESERVED:
        raise ValueError(f"namespace {ns!r} is one PyTorch uses itself; pass namespace='my_kernels'")
    return ns


def _plan(torch: Any, kernels: KernelSet, namespace: str) -> list[_OpSpec]:
    """One spec per entry: its own name, or ``<crate>_<entry>`` for a name several crates use."""
    by_name: dict[str, list[Kernel]] = {}
    for ck in kernels.crates.values():
        for k in ck:
            by_name.setdefault(k.name, []).append(k)
    specs: list[_OpSpec] = []
    owner: dict[str, str] = {}
    for name, ks in by_name.items():
        for k in ks:
            op_name = name if len(ks) == 1 else f"{_sanitize(k.crate)}_{name}"
            other = owner.get(op_name)
            if other is not None:
                raise KhalError(
                    f"package {kernels.package!r}: entries {other} and {k.crate}.{name} would both be "
                    f"the operator {namespace}::{op_name} (an entry several crates define is named "
                    "<crate>_<entry>); rename one of the entries")
            owner[op_name] = f"{k.crate}.{name}"
            specs.append(_spec(torch, namespace, op_name, k))
    return specs


# ---------------------------------------------------------------------------------------------
# the registered operators
# ---------------------------------------------------------------------------------------------
class CrateOps:
    """One crate's operators: ``ops.crates["core"].saxpy`` (every entry, also those whose name
    other crates use too)."""

    def __init__(self, name: str, packets: dict[str, Any]) -> None:
        self.name = name
        self._packets = packets

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_packets"][name]
        except KeyError:
            raise AttributeError(f"crate {self.name!r} has no entry {name!r}; it has "
                                 f"{', '.join(sorted(self._packets)) or 'none'}") from None

    def __getitem__(self, name: str) -> Any:
        return self._packets[name]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._packets.values())

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._packets))

    def __repr__(self) -> str:
        return f"<CrateOps {self.name} entries={sorted(self._packets)}>"


class TorchOps:
    """The operators :func:`register` defined for one package.

    ``ops.<entry>`` is ``torch.ops.<namespace>.<op>`` (an ``OpOverloadPacket``) for an entry
    name one crate has; ``ops.crates[<crate>].<entry>`` for every entry; ``ops.op_names`` maps
    ``"crate.entry"`` to the operator's name."""

    def __init__(self, namespace: str, kernels: KernelSet, specs: list[_OpSpec]) -> None:
        self.namespace = namespace
        self.package = kernels.package
        self.kernels = kernels
        self._specs = {s.op_name: s for s in specs}
        self.op_names: dict[str, str] = {f"{s.crate}.{s.entry.name}": s.op_name for s in specs}
        self._signature = _signature(specs)
        counts: dict[str, int] = {}
        for s in specs:
            counts[s.entry.name] = counts.get(s.entry.name, 0) + 1
        self._by_entry = {s.entry.name: s.packet for s in specs if counts[s.entry.name] == 1}
        crates: dict[str, dict[str, Any]] = {}
        for s in specs:
            crates.setdefault(s.crate, {})[s.entry.name] = s.packet
        self.crates = {c: CrateOps(c, p) for c, p in crates.items()}

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        p = d.get("_by_entry", {}).get(name)
        if p is not None:
            return p
        specs = d.get("_specs", {})
        if name in specs:
            return specs[name].packet
        crates = sorted(c for c, ops in d.get("crates", {}).items() if name in ops._packets)
        if crates:
            raise AttributeError(f"entry {name!r} exists in crates {crates}; use ops.crates[<crate>].{name} "
                                 f"(torch.ops.{d['namespace']}.<crate>_{name})")
        raise AttributeError(f"package {d.get('package')!r} has no entry {name!r}; it has "
                             f"{', '.join(sorted(d.get('_by_entry', {}))) or 'none'}")

    def __iter__(self) -> Iterator[Any]:
        return iter(s.packet for s in self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._by_entry))

    def schema(self, op_name: str) -> str:
        """The operator's schema as PyTorch parsed it."""
        return str(self._specs[op_name].packet.default._schema)

    def _rebind(self, kernels: KernelSet) -> None:
        for s in self._specs.values():
            s.kernel = kernels.crates[s.crate][s.entry.name]
            s.entry = s.kernel.entry
        self.kernels = kernels

    def __repr__(self) -> str:
        return f"<TorchOps torch.ops.{self.namespace} ({self.package}): {sorted(self._specs)}>"


def _signature(specs: list[_OpSpec]) -> tuple[tuple[str, str, str, str], ...]:
    return tuple(sorted((s.op_name, s.crate, s.entry.name, s.schema) for s in specs))


_lock = threading.RLock()
_by_namespace: dict[str, TorchOps] = {}
#: "namespace::op" -> its spec (for :func:`uniform`)
_by_qualname: dict[str, _OpSpec] = {}


def registered(namespace: str) -> TorchOps | None:
    """The operators registered under ``namespace`` in this process, if any."""
    return _by_namespace.get(namespace)


def register(kernels: KernelSet, namespace: str | None = None) -> TorchOps:
    """Register every entry of a loaded package (``khal_runtime.load(...)``) as a PyTorch custom
    operator, ``torch.ops.<namespace>.<entry>``; the namespace defaults to the package's import
    name (``.`` and ``-`` as ``_``). An entry name several crates define becomes
    ``<crate>_<entry>`` for each of them.

    Idempotent: registering the same package again returns the same :class:`TorchOps` (and for
    another load of it with the same entries, e.g. after a reload, the operators launch through
    the newest one). A namespace holding another package's operators, or this package's with
    other signatures, is a :class:`~khal_runtime.errors.KhalError`: PyTorch cannot redefine an
    operator in a running process."""
    if not isinstance(kernels, KernelSet):
        raise TypeError(f"register() takes the kernels of a package (khal_runtime.load(...)), got "
                        f"{type(kernels).__module__}.{type(kernels).__qualname__}")
    ns = _namespace(kernels.package if namespace is None else namespace, namespace is not None)
    torch = _torch()
    with _lock:
        prev = _by_namespace.get(ns)
        if prev is not None and prev.kernels is kernels:
            return prev
        specs = _plan(torch, kernels, ns)
        if prev is not None:
            if prev.package == kernels.package and prev._signature == _signature(specs):
                prev._rebind(kernels)
                return prev
            what = (f"package {prev.package!r}" if prev.package != kernels.package else
                    f"package {prev.package!r} with other entries or signatures (was it rebuilt?)")
            raise KhalError(
                f"torch.ops.{ns} already holds the operators of {what}; PyTorch cannot redefine an "
                f"operator in a running process: register {kernels.package!r} under another "
                f"namespace (register(kernels, namespace='...')), or restart Python")
        namespace_ops = getattr(torch.ops, ns)
        clash = [s.op_name for s in specs if hasattr(namespace_ops, s.op_name)]
        if clash:
            raise KhalError(f"torch.ops.{ns} already has operator(s) {', '.join(sorted(clash))} that "
                            f"hatch-khal did not register for {kernels.package!r}; pass another "
                            "namespace: register(kernels, namespace='...')")
        for s in specs:
            s.opdef = torch.library.custom_op(s.qualname, _make_impl(s), mutates_args=s.mutates,
                                              schema=s.schema)
            s.opdef.register_fake(_make_fake(s))
            s.packet = getattr(namespace_ops, s.op_name)
            _by_qualname[s.qualname] = s
        ops = TorchOps(ns, kernels, specs)
        _by_namespace[ns] = ops
        return ops


# ---------------------------------------------------------------------------------------------
# the implementations
# ---------------------------------------------------------------------------------------------
_torch_module: Any = None
_raw_stream: Callable[[int], int] | None = None
#: (device, CUstream handle) -> the runtime's Stream for it
_streams: dict[tuple[int, int], Stream] = {}


def _torch() -> Any:
    global _torch_module, _raw_stream
    if _torch_module is None:
        import torch  # lazy: importing khal_runtime never imports torch

        fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if fast is None:
            def fast(device: int) -> int:
                return int(torch.cuda.current_stream(device).cuda_stream)
        _raw_stream = fast
        _torch_module = torch
    return _torch_module


def _stream_for(spec: _OpSpec, device: int, handle: int) -> Stream:
    """The runtime's Stream for PyTorch's stream ``handle`` on ``device`` (kept: the same handle
    gives the same object, so repeated launches stay on the runtime's fast path)."""
    bk = spec.kernel._crate.backend
    if bk.name != "cuda":
        raise BackendUnavailableError(
            f"khal torch operators launch on CUDA tensors, but the process's backend is {bk.name!r} "
            "(KHAL_BACKEND); unset KHAL_BACKEND or set it to cuda")
    st = Stream(handle, device, backend=bk)
    if len(_streams) >= _STREAMS_MAX:
        _streams.clear()
    _streams[(device, handle)] = st
    return st


def _not_cuda(spec: _OpSpec, index: int, t: Any) -> ArgumentError:
    p = spec.entry.params[index]
    return ArgumentError(f"{spec.where}: argument {p.name!r} ({p.describe(True)}) is a tensor on {t.device}; "
                         "khal kernels run on CUDA tensors: move it with .cuda()")


def _first_use(spec: _OpSpec, device: int) -> None:
    """Before the first launch of an entry whose crate is not loaded on the device: loading it
    is a call a capture in PyTorch's (global) mode would refuse and be invalidated by."""
    torch = _torch()
    if torch.cuda.is_current_stream_capturing():
        raise CaptureError(
            f"{spec.where} is used for the first time on cuda:{device} inside a graph capture: loading "
            "its kernels cannot be captured. Run the step once before torch.cuda.graph (the warm-up "
            f"PyTorch asks for), or load the crate first: kernels.crates[{spec.crate!r}].load({device})")


def _launch(spec: _OpSpec, threads: Any, args: tuple[Any, ...]) -> None:
    """The real implementation: launch on PyTorch's current stream of the tensors' device."""
    i = spec.first_tensor
    if i is not None:
        t = args[i]
        if not t.is_cuda:
            raise _not_cuda(spec, i, t)
        dev = t.get_device()
    else:
        dev = _torch().cuda.current_device()
    h = _raw_stream(dev)  # type: ignore[misc]  # set by _torch() in register()
    st = _streams.get((dev, h))
    if st is None:
        st = _stream_for(spec, dev, h)
    if spec.reinterpret:
        args = _reinterpreted(spec, args)
    kernel = spec.kernel
    if dev not in kernel._plans and dev not in kernel._crate._modules:
        _first_use(spec, dev)
    kernel(threads, *args, stream=st)


def _make_impl(spec: _OpSpec) -> Callable[..., None]:
    def impl(threads: Any, *args: Any) -> None:
        _launch(spec, threads, args)

    impl.__name__ = spec.op_name
    impl.__qualname__ = f"khal_op[{spec.qualname}]"
    return impl


def _make_fake(spec: _OpSpec) -> Callable[..., None]:
    def fake(threads: Any, *args: Any) -> None:
        _check_tensors(spec, threads, args)

    fake.__name__ = f"{spec.op_name}_fake"
    return fake


def _static(v: Any) -> int | None:
    return v if isinstance(v, int) else None


def _check_tensors(spec: _OpSpec, threads: Any, args: Sequence[Any]) -> None:
    """What can be checked without data (the fake implementation): tensor dtypes and byte sizes,
    one device for all, a thread count >= 0. Sizes that are symbolic are left to the launch."""
    torch = _torch()
    n = _static(threads)
    if n is not None and n < 0:
        raise ArgumentValueError(f"{spec.where}: thread count must be >= 0, got {n}")
    device = None
    for p, a in zip(spec.entry.params, args):
        reader = _READERS.of(p.kind, spec.where)
        if not reader.tensor:
            continue
        arg = f"{spec.where}: argument {p.name!r} ({p.describe(True)})"
        if device is None:
            device = a.device
        elif a.device != device:
            raise ArgumentValueError(f"{arg} is on {a.device}, an earlier tensor argument on {device}: "
                                     "every tensor of one launch must be on the same device")
        nbytes = _static(a.numel())
        if nbytes is not None:
            nbytes *= a.element_size()
        if reader.uniform:
            if nbytes is not None and nbytes < p.element_size:
                raise ArgumentValueError(f"{arg}: the tensor holds {nbytes} bytes, the struct needs "
                                         f"{p.element_size}; make it with khal_runtime.torch.uniform()")
        elif p.element_type in _TORCH_DTYPES:
            want = getattr(torch, p.element_type)
            if a.dtype != want:
                raise ArgumentError(f"{arg}: expected a tensor of dtype {want}, got {a.dtype}")
        elif nbytes is not None and nbytes % p.element_size:
            raise ArgumentValueError(f"{arg}: the tensor's {nbytes} bytes are not a whole number of "
                                     f"{p.element_size}-byte elements")


# ---------------------------------------------------------------------------------------------
# storages of struct / complex elements: a view of the tensor's bytes
# ---------------------------------------------------------------------------------------------
class _Reinterpreted:
    """A CUDA tensor's memory read as elements of a struct (or complex) type: torch has no
    dtype the runtime could check against the manifest's, so the element count is the tensor's
    bytes divided by the element size, which must divide them."""

    __slots__ = ("ptr", "count", "key", "device", "tensor")

    def __init__(self, ptr: int, count: int, key: str, device: int, tensor: Any) -> None:
        self.ptr, self.count, self.key, self.device, self.tensor = ptr, count, key, device, tensor


def _extract(v: _Reinterpreted) -> tuple[int, int, str]:
    return v.ptr, v.count, v.key


def _device(v: _Reinterpreted) -> int | None:
    return v.device


interop.register_array_type(_Reinterpreted, _extract, device=_device, storage=lambda v: v.tensor,
                            name="torch.Tensor (as struct elements)")


def _reinterpreted(spec: _OpSpec, args: tuple[Any, ...]) -> tuple[Any, ...]:
    out = list(args)
    for i in spec.reinterpret:
        p = spec.entry.params[i]
        t = out[i]
        arg = f"{spec.where}: argument {p.name!r} ({p.describe(True)})"
        if not t.is_cuda:
            raise _not_cuda(spec, i, t)
        if not t.is_contiguous():
            raise ArgumentValueError(f"{arg} is a non-contiguous tensor; pass .contiguous()")
        nbytes = t.numel() * t.element_size()
        if nbytes % p.element_size:
            raise ArgumentValueError(f"{arg}: the tensor's {nbytes} bytes are not a whole number of "
                                     f"{p.element_size}-byte elements")
        key = p.element_type if p.element_type in abi.SCALARS else f"V{p.element_size}"
        out[i] = _Reinterpreted(t.data_ptr(), nbytes // p.element_size, key, t.get_device(), t)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# uniforms as tensors
# ---------------------------------------------------------------------------------------------
def _entry_of(op: Any) -> tuple[Entry, str]:
    """(entry, how to name it) of a Kernel, an operator (packet, overload, CustomOpDef or its
    "namespace::name"), or a manifest Entry."""
    if isinstance(op, Kernel):
        return op.entry, f"{op.crate}.{op.name}"
    if isinstance(op, Entry):
        return op, op.name
    qual = op if isinstance(op, str) else (
        getattr(op, "_qualified_op_name", None) or getattr(op, "_qualname", None)
        or getattr(getattr(op, "_overloadpacket", None), "_qualified_op_name", None))
    spec = _by_qualname.get(qual) if isinstance(qual, str) else None
    if spec is None:
        raise TypeError(f"uniform(): expected a kernel (kernels.<entry>), a khal torch operator "
                        f"(torch.ops.<namespace>.<entry>) or its entry, got {op!r}")
    return spec.entry, spec.where


def _uniform_param(entry: Entry, where: str, param: str | None) -> Param:
    uniforms = [p for p in entry.params if _READERS.of(p.kind).uniform]
    if param is None:
        if len(uniforms) == 1:
            return uniforms[0]
        if not uniforms:
            raise ArgumentError(f"{where} has no uniform parameter")
        raise ArgumentError(f"{where} has several uniform parameters "
                            f"({', '.join(p.name for p in uniforms)}): pass param='<name>'")
    for p in uniforms:
        if p.name == param:
            return p
    raise ArgumentError(f"{where} has no uniform parameter {param!r}; its uniforms: "
                        f"{', '.join(p.name for p in uniforms) or 'none'}")


def struct_bytes(entry: Entry, param: Param, value: Any, where: str | None = None) -> bytes:
    """The C-layout bytes of a host uniform value, by the launch's own rules
    (:func:`khal_runtime.arguments.struct_bytes`): a ctypes struct, a NumPy structured value,
    bytes, or (crates that record the layout: Slang) a dict of field values."""
    arg = f"{where or entry.name + '()'}: argument {param.name!r} ({param.describe(True)})"
    got = _struct_bytes(arg, param, value)
    if not isinstance(got, bytes):
        raise ArgumentError(f"{arg}: {type(value).__name__} is already device memory; pass a torch "
                            "tensor holding the struct's bytes, or the host value")
    if len(got) != param.element_size:
        raise ArgumentValueError(f"{arg}: expected {param.element_size} bytes, got {len(got)} "
                                 f"({type(value).__name__})")
    return got


def uniform(op: Any, value: Any, device: Any = "cuda", *, param: str | None = None, out: Any = None) -> Any:
    """A uniform argument as the operators take it: a ``torch.uint8`` tensor of the struct's bytes
    (C layout) on ``device``.

    ``op`` is a khal operator (``ops.saxpy``, ``torch.ops.pkg.saxpy``), a kernel
    (``kernels.saxpy``) or its entry; ``value`` a ctypes Structure, a NumPy structured scalar or
    0-d array, ``bytes``, a dict of field values (Slang crates: packed by the recorded CUDA
    layout), or a tensor (returned as it is, after its size is checked). ``param`` names the
    uniform of an entry with several. ``out=`` writes the bytes into an existing tensor instead
    (in place: a graph that captured it sees the new values on its next replay)."""
    entry, where = _entry_of(op)
    p = _uniform_param(entry, where, param)
    torch = _torch()
    if isinstance(value, torch.Tensor):
        nbytes = value.numel() * value.element_size()
        if nbytes < p.element_size:
            raise ArgumentValueError(f"{where}: argument {p.name!r} ({p.describe(True)}): the tensor holds "
                                     f"{nbytes} bytes, the struct needs {p.element_size}")
        host = value.contiguous().view(-1).view(torch.uint8)[: p.element_size]
    else:
        host = torch.frombuffer(bytearray(struct_bytes(entry, p, value, where)), dtype=torch.uint8)
    if out is None:
        return host.to(device)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.numel() != p.element_size \
            or not out.is_contiguous():
        raise ArgumentError(f"{where}: uniform(out=...) takes a contiguous torch.uint8 tensor of "
                            f"{p.element_size} elements (what uniform() returns), got {out!r:.80}")
    out.copy_(host)
    return out

