"""A shader package's kernels as PyTorch operators, for ``torch.compile`` and CUDA graphs.

    import torch
    import khal_runtime.torch as khal_torch
    from example_shader_pkg import SaxpyParams, kernels

    ops = khal_torch.register(kernels)          # torch.ops.example_shader_pkg.<entry>
    params = khal_torch.uniform(ops.saxpy, SaxpyParams(a=2.0), "cuda")   # the struct's bytes, on the GPU
    torch.ops.example_shader_pkg.saxpy(n, x, y, params)   # eager, compiled or captured alike

:func:`register` defines one operator per entry in a :class:`torch.library.Library` fragment of
the namespace: ``(SymInt threads, <one argument per kernel parameter>) -> ()``. A storage is a
``Tensor`` (``Tensor(a!)`` when the kernel may write it), a uniform is a ``Tensor`` holding the
struct's bytes (made by :func:`uniform`), a scalar is an ``int`` / ``float`` / ``bool`` /
``complex`` by the family of its ABI type. Each operator has a kernel at the dispatcher's
``CUDA`` key (the launch, on PyTorch's current stream of the tensors' device, so it is ordered
with the surrounding torch work and recorded by ``torch.cuda.graph``), a fake implementation
(:func:`torch.library.register_fake`: argument checks only, the kernels write their outputs in
place and return nothing), so ``torch.compile(fullgraph=True)`` traces it and functionalizes the
written tensors (``auto_functionalized``, re-inplaced by Inductor), and a kernel for every other
device (``CompositeExplicitAutograd``) that says the tensors must be on CUDA. The launch bumps the
version counter of each tensor it writes, as PyTorch's in-place operators do.

A Triton crate's instance family (:class:`~khal_runtime.triton.TritonKernel`) is one operator
taking what ``k[grid](...)`` takes, ``(SymInt[] grid, <one argument per runtime argument>) -> ()``,
each pointer a ``Tensor(a!)`` unless the build proved from Triton's IR that the kernel only reads
it (``TritonFacts.written``: then a plain ``Tensor``, never bumped), launched as
``family[grid](*args, stream=...)`` so the family checks and chooses: :mod:`khal_runtime.torch_triton`.

Not :func:`torch.library.custom_op`: its Python layers (autograd and in-place kernels, the
dynamo-disabled wrapper, the aliasing check) cost about ten microseconds per call, and its
version bump before the launch made the typed call's memo miss on every call. The ``CUDA``
kernel here keeps, per operator, a few bound launches (:meth:`~khal_runtime.kernels.Kernel.bind`)
of argument sets one of its last four unbound calls on the same stream had too: a repeated call
checks the arguments' identity, the tensors' version (or the one the operator's own last launch
left) and ``data_ptr()`` (else their full facts) and the current stream, then launches the bound
argument block.

Loading a package registers nothing, and importing ``khal_runtime`` never imports torch: only
this module does, inside :func:`register` and :func:`uniform`. Registering is explicit and
idempotent. A generic-layer module: it reaches the CUDA backend only through the kernels' own
launch path (``stream=`` takes the raw handle PyTorch gives, ``bind()``).
"""

from __future__ import annotations

import keyword
import os
import re
import sys
import threading
from dataclasses import dataclass
from operator import is_
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, Union, cast

from khal_runtime import abi, interop
from khal_runtime.arguments import struct_bytes as _struct_bytes
from khal_runtime.device import Stream
from khal_runtime.errors import ArgumentError, ArgumentValueError, BackendUnavailableError, CaptureError, KhalError
from khal_runtime.generated import define
from khal_runtime.kernels import Kernel, KernelSet
from khal_runtime.manifest_records import Entry as _EntryRecord
from khal_runtime.torch_triton import TritonOpSpec, check_fake, not_cuda, other_device, triton_spec
from khal_runtime.triton import TritonKernel

if TYPE_CHECKING:
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
    #: parameter indices of the tensor arguments, and of those the kernel may write
    tensors: tuple[int, ...] = ()
    written: tuple[int, ...] = ()
    #: ``torch.ops.<namespace>.<op>``
    packet: Any = None
    #: the crate the entry is in (its backend, whether it is loaded on a device)
    crate_kernels: Any = None
    #: bound launches of argument sets seen twice, newest first (the CUDA kernel's fast path)
    fast: tuple[_Bound, ...] = ()
    #: (device, stream handle, arguments) of the last calls that were not bound (see :func:`_launch`)
    seen: tuple[tuple[int, int, tuple[Any, ...]], ...] = ()
    #: the bound launch of the operator's last bound call (its tensors' versions after it: see
    #: :func:`_still`)
    last: _Bound | None = None

    @property
    def entry_name(self) -> str:
        return self.entry.name

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.op_name}"

    @property
    def where(self) -> str:
        return f"torch.ops.{self.namespace}.{self.op_name}() (entry {self.crate}.{self.entry.name})"

    def forget(self) -> None:
        """Drop the launches bound to a previous load's kernels."""
        self.fast, self.seen, self.last = (), (), None


#: an operator: a CUDA C++ / Slang entry's, or a Triton instance family's (:mod:`khal_runtime.torch_triton`)
_Spec = Union[_OpSpec, TritonOpSpec]


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
    tensors = []
    written = []
    for i, (p, n) in enumerate(zip(entry.params, names[1:])):
        t = _schema_type(p)
        if t == "Tensor":
            first = i if first is None else first
            tensors.append(i)
            if _READERS.of(p.kind).typed:
                if p.element_type not in _TORCH_DTYPES:
                    reinterpret.append(i)
                if p.writable:
                    t = f"Tensor(a{i}!)"
                    mutates.append(n)
                    written.append(i)
        parts.append(f"{t} {n}")
    return _OpSpec(namespace, op_name, kernel.crate, entry, kernel, tuple(names),
                   f"({', '.join(parts)}) -> ()", tuple(mutates), first, tuple(reinterpret),
                   tuple(tensors), tuple(written))


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


def _plan(torch: Any, kernels: KernelSet, namespace: str) -> list[_Spec]:
    """One spec per entry: its own name, or ``<crate>_<entry>`` for a name several crates use."""
    by_name: dict[str, list[Kernel | TritonKernel]] = {}  # (a Triton crate's are families)
    for ck in kernels.crates.values():
        for k in ck:
            by_name.setdefault(k.name, []).append(k)
    specs: list[_Spec] = []
    owner: dict[str, str] = {}
    for name, ks in by_name.items():
        for kf in ks:
            op_name = name if len(ks) == 1 else f"{_sanitize(kf.crate)}_{name}"
            other = owner.get(op_name)
            if other is not None:
                raise KhalError(
                    f"package {kernels.package!r}: entries {other} and {kf.crate}.{name} would both be "
                    f"the operator {namespace}::{op_name} (an entry several crates define is named "
                    "<crate>_<entry>); rename one of the entries")
            owner[op_name] = f"{kf.crate}.{name}"
            if isinstance(kf, TritonKernel):
                specs.append(triton_spec(lambda n: _valid_arg_name(torch, n), namespace, op_name, kf))
            else:
                specs.append(_spec(torch, namespace, op_name, kf))
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

    def __init__(self, namespace: str, kernels: KernelSet, specs: list[_Spec], library: Any) -> None:
        self.namespace = namespace
        #: the ``torch.library.Library`` fragment holding the operators (kept: dropping it
        #: would unregister them)
        self.library = library
        self.package = kernels.package
        self.kernels = kernels
        self._specs = {s.op_name: s for s in specs}
        self.op_names: dict[str, str] = {f"{s.crate}.{s.entry_name}": s.op_name for s in specs}
        self._signature = _signature(specs)
        counts: dict[str, int] = {}
        for s in specs:
            counts[s.entry_name] = counts.get(s.entry_name, 0) + 1
        self._by_entry = {s.entry_name: s.packet for s in specs if counts[s.entry_name] == 1}
        crates: dict[str, dict[str, Any]] = {}
        for s in specs:
            crates.setdefault(s.crate, {})[s.entry_name] = s.packet
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
            s.kernel = kernels.crates[s.crate][s.entry_name]
            s.entry = s.kernel.entry
            s.crate_kernels = kernels.crates[s.crate]
            s.forget()  # what was bound to the previous load's kernels
        self.kernels = kernels

    def __repr__(self) -> str:
        return f"<TorchOps torch.ops.{self.namespace} ({self.package}): {sorted(self._specs)}>"


def _signature(specs: list[_Spec]) -> tuple[tuple[str, str, str, str], ...]:
    return tuple(sorted((s.op_name, s.crate, s.entry_name, s.schema) for s in specs))


_lock = threading.RLock()
_by_namespace: dict[str, TorchOps] = {}
#: "namespace::op" -> its spec (for :func:`uniform`)
_by_qualname: dict[str, _Spec] = {}


def _same_place(a: Any, b: Any) -> bool:
    """Whether two loads' package directories are one (a reload), not two copies side by side."""
    try:
        return bool(os.path.samefile(a, b))
    except OSError:  # (a directory gone since, or a KernelSet made without one)
        return bool(os.path.abspath(a) == os.path.abspath(b))


def registered(namespace: str) -> TorchOps | None:
    """The operators registered under ``namespace`` in this process, if any."""
    return _by_namespace.get(namespace)


def register(kernels: KernelSet, namespace: str | None = None) -> TorchOps:
    """Register every entry of a loaded package (``khal_runtime.load(...)``) as a PyTorch
    operator, ``torch.ops.<namespace>.<entry>``; the namespace defaults to the package's import
    name (``.`` and ``-`` as ``_``). An entry name several crates define becomes
    ``<crate>_<entry>`` for each of them. Each operator is defined in a
    ``torch.library.Library(namespace, "FRAGMENT")`` (:attr:`TorchOps.library`) with a kernel at
    the ``CUDA`` key, a fake implementation and a kernel for other devices that refuses them.

    Idempotent: registering the same package again returns the same :class:`TorchOps` (and for
    another load of it from the same directory with the same entries, e.g. after a reload, the
    operators launch through the newest one). A namespace holding another package's operators,
    this package's with other signatures, or those of another copy of it (the same name loaded
    from another directory: two installs side by side, a vendored copy) is a
    :class:`~khal_runtime.errors.KhalError`: PyTorch cannot redefine an operator in a running
    process, and one copy must not take over the other's."""
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
            same = prev.package == kernels.package and prev._signature == _signature(specs)
            if same and _same_place(prev.kernels.package_dir, kernels.package_dir):
                prev._rebind(kernels)  # another load of the same copy (a reload, a rebuild in place)
                return prev
            if same:
                raise KhalError(
                    f"torch.ops.{ns} holds the operators of package {prev.package!r} loaded from "
                    f"{prev.kernels.package_dir}; this is another copy of it, loaded from {kernels.package_dir} "
                    "(two installs side by side, a vendored copy), whose kernels would take the first's "
                    f"operators over: register this copy under a namespace of its own "
                    f"(register(kernels, namespace='...')), or import one copy only")
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
        lib = torch.library.Library(ns, "FRAGMENT")
        for s in specs:
            s.crate_kernels = kernels.crates[s.crate]
            # pt2_compliant_tag: what custom_op declares too (the op works with torch.compile)
            lib.define(f"{s.op_name}{s.schema}", tags=(torch.Tag.pt2_compliant_tag,))
            if isinstance(s, TritonOpSpec):
                lib.impl(s.op_name, _make_triton_cuda_impl(s), "CUDA")
                lib.impl(s.op_name, _make_triton_impl(s), "CompositeExplicitAutograd")
                torch.library.register_fake(s.qualname, _make_triton_fake(s), lib=lib)
            else:
                lib.impl(s.op_name, _make_cuda_impl(s), "CUDA")
                lib.impl(s.op_name, _make_impl(s), "CompositeExplicitAutograd")
                torch.library.register_fake(s.qualname, _make_fake(s), lib=lib)
            s.packet = getattr(namespace_ops, s.op_name)
            _by_qualname[s.qualname] = s
        ops = TorchOps(ns, kernels, specs, lib)
        _by_namespace[ns] = ops
        return ops


# ---------------------------------------------------------------------------------------------
# the implementations
# ---------------------------------------------------------------------------------------------
_torch_module: Any = None
_raw_stream: Callable[[int], int] | None = None
_bump: Callable[[Any], None] | None = None
#: (device, CUstream handle) -> the runtime's Stream for it
_streams: dict[tuple[int, int], Stream] = {}
#: bound launches an operator keeps, and argument sets it remembers as seen
_FAST_MAX = 4
_SEEN_MAX = 4
#: Python scalar types an argument may be compared by value (a launch packs their value)
_SCALAR_TYPES = frozenset({int, float, bool, complex})


def _torch() -> Any:
    global _torch_module, _raw_stream, _bump
    if _torch_module is None:
        import torch  # lazy: importing khal_runtime never imports torch

        fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if fast is None:
            def fast(device: int) -> int:
                return int(torch.cuda.current_stream(device).cuda_stream)
        _raw_stream = fast
        # torch.autograd.graph.increment_version without its wrapper (skips inference tensors)
        _bump = getattr(torch._C, "_increment_version", None) or torch.autograd.graph.increment_version
        _torch_module = torch
    return _torch_module


def _stream_for(spec: _Spec, device: int, handle: int) -> Stream:
    """The runtime's Stream for PyTorch's stream ``handle`` on ``device`` (kept: the same handle
    gives the same object, so repeated launches stay on the runtime's fast path)."""
    bk = spec.crate_kernels.backend
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


def _first_use(spec: _Spec, device: int) -> None:
    """Before the first launch of an entry whose crate is not loaded on the device: loading it
    is a call a capture in PyTorch's (global) mode would refuse and be invalidated by."""
    torch = _torch()
    if torch.cuda.is_current_stream_capturing():
        raise CaptureError(
            f"{spec.where} is used for the first time on cuda:{device} inside a graph capture: loading "
            "its kernels cannot be captured. Run the step once before torch.cuda.graph (the warm-up "
            f"PyTorch asks for), or load the crate first: kernels.crates[{spec.crate!r}].load({device})")


def _loaded(spec: _Spec, device: int) -> bool:
    """Whether the entry's crate is loaded on ``device`` (then a launch loads nothing)."""
    return device in getattr(spec.crate_kernels, "_modules", ())


class _Bound:
    """One argument set of an operator, bound (:meth:`Kernel.bind`) on one stream: reused while
    the same objects come back, each tensor with the version, ``data_ptr()`` and dtype it had after
    the last launch (or, after an in-place op elsewhere, the same full facts), on that stream."""

    __slots__ = ("args", "tensors", "facts", "ptrs", "dtypes", "keys", "versions", "deltas", "written", "device",
                 "handle", "launch")

    def __init__(self, args: tuple[Any, ...], tensors: tuple[Any, ...], written: tuple[Any, ...],
                 device: int, handle: int, launch: Any) -> None:
        self.args, self.tensors, self.written = args, tensors, written
        self.device, self.handle, self.launch = device, handle, launch
        self.facts = tuple(_facts(t) for t in tensors)
        self.ptrs = tuple(f[3] for f in self.facts)
        self.dtypes = tuple(f[5] for f in self.facts)
        #: each tensor's data_ptr() and dtype, in turn (``.data =`` may change either, not the version)
        self.keys = tuple(x for f in self.facts for x in (f[3], f[5]))
        self.versions: tuple[int, ...] = ()
        self.deltas: tuple[int, ...] = ()


def _facts(t: Any) -> tuple[Any, ...]:
    """What the launch packed of a tensor (the typed call's full read)."""
    return (t.is_cuda, t.get_device(), t.is_contiguous(), t.data_ptr(), t.numel(), t.dtype)


def _same(a: Any, b: Any) -> bool:
    """``a`` is ``b``, or both are Python scalars of one type that pack the same value."""
    if a is b:
        return True
    tp = type(a)
    if tp is not type(b) or tp not in _SCALAR_TYPES or a != b:
        return False
    return tp is int or tp is bool or repr(a) == repr(b)  # 0.0 == -0.0, but not the same bits


def _make_cuda_impl(spec: _OpSpec) -> Callable[..., None]:
    """The kernel at the ``CUDA`` key: a bound launch of this argument set on this stream if the
    operator has one that still holds, else :func:`_launch`. A bound launch holds while the same
    objects come back (scalars: the same value, to the sign of a zero), PyTorch's current
    stream of its device is the one it was bound on, and each tensor has the ``data_ptr()`` it
    had after the last launch and either the version it had then or, after an in-place op since,
    the same facts the launch packed (:func:`_still`).

    Generated per operator, straight-line over its arguments (this runs on every call: a
    ``map`` over the tensors reads them several times slower than ``a0._version, ...``). The
    arguments are compared with one chain: tensors by identity, scalars by identity or value
    (a float through the dispatcher is a new object every call), so an argument set the
    operator has not bound fails at its first new tensor. Whether one of the last unbound calls
    had the same objects is checked here too (``seen``): a set seen for the first time (a
    compiled graph's intermediate, a new tensor every call) goes to :func:`_launch` with
    nothing to compare there."""
    n = len(spec.entry.params)
    a = [f"a{i}" for i in range(n)]
    if not spec.tensors:  # nothing to bind against: the typed call's own memo serves
        src = [f"def cuda_impl(threads{''.join(', ' + x for x in a)}):",
               f"    _launch(spec, threads, ({''.join(x + ', ' for x in a)}))"]
    else:
        t = [a[i] for i in spec.tensors]
        tensor_set = set(spec.tensors)

        def same(arr: str) -> str:
            return " and ".join(f"{x} is {arr}[{i}]" if i in tensor_set else
                                f"({x} is {arr}[{i}] or _same({x}, {arr}[{i}]))" for i, x in enumerate(a))

        written = "({})".format("".join(a[i] + ", " for i in spec.written))
        args = f"({''.join(x + ', ' for x in a)})"
        src = [
            f"def cuda_impl(threads{''.join(', ' + x for x in a)}):",
            "    for b in spec.fast:",
            "        A = b.args",
            f"        if not ({same('A')}):",
            "            continue",
            "        if _raw_stream(b.device) != b.handle:",
            "            continue",
            "        try:",
            f"            vs = ({''.join(x + '._version, ' for x in t)})",
            "            if vs != b.versions:  # an in-place op: this op's launch of another set, or another op",
            f"                if not _still(b, spec.last, ({''.join(x + ', ' for x in t)}), vs):",
            "                    continue",
            f"            elif ({''.join(x + '.data_ptr(), ' + x + '.dtype, ' for x in t)}) != b.keys:  # .data =, swap_tensors",
            "                continue",
            "        except Exception:  # e.g. a tensor swapped into an inference tensor: no version",
            "            continue",
            "        b.launch(threads)",
            *([f"        _bump({written})"] if spec.written else []),
            "        d = b.deltas",
            f"        b.versions = ({''.join(f'vs[{j}] + d[{j}], ' for j in range(len(t)))})",
            "        spec.last = b",
            "        return",
            "    for S in spec.seen:",
            "        P = S[2]",
            f"        if {same('P')}:",
            f"            _launch(spec, threads, {args}, {written}, True)",
            "            return",
            f"    _launch(spec, threads, {args}, {written}, False)",
        ]
    src = ["def make(spec):", *("    " + ln for ln in src), "    return cuda_impl"]
    # the module's globals: _raw_stream, _bump, _launch are read at call time (set by _torch())
    make = define("\n".join(src) + "\n", f"torch op {spec.qualname}", {}, "make", module=globals())
    fn: Callable[..., None] = make(spec)
    fn.__name__ = spec.op_name
    fn.__qualname__ = f"khal_op_cuda[{spec.qualname}]"
    return fn


def _still(b: _Bound, last: _Bound | None, tensors: tuple[Any, ...], versions: tuple[Any, ...]) -> bool:
    """Whether the bound launch ``b`` still holds for ``tensors``, some of whose ``versions``
    moved since its last launch: each tensor has the ``data_ptr()`` it had then and, if its
    version moved, either the version this operator's last bound launch (``last``) left it at,
    with the same facts as ``b`` packed (the bump was that launch's own: a tensor written by
    every one of several argument sets used in turn; that launch checked its facts), or else
    the same facts read again."""
    vb, fb, pb, db = b.versions, b.facts, b.ptrs, b.dtypes
    lt, lv, lf = (last.tensors, last.versions, last.facts) if last is not None else ((), (), ())
    for j, t in enumerate(tensors):
        v = versions[j]
        if v == vb[j] or (j < len(lt) and lt[j] is t and lv[j] == v and lf[j] == fb[j]):
            if t.data_ptr() != pb[j] or t.dtype is not db[j]:  # (.data = keeps the version)
                return False
        elif _facts(t) != fb[j]:
            return False
    return True


def _launch(spec: _OpSpec, threads: Any, args: tuple[Any, ...], written: tuple[Any, ...] | None = None,
            again: bool = True) -> None:
    """The launch without a bound one: on PyTorch's current stream of the tensors' device (any
    other device is refused, naming the argument). An argument set one of the operator's last
    ``_SEEN_MAX`` unbound calls on the same stream had too (the same objects, scalars of the same
    value) is bound and kept for :func:`_make_cuda_impl`'s fast path; others go through the
    typed call. Each tensor the kernel may write gets its version counter bumped (``written``:
    those tensors, from the generated CUDA kernel, else picked here). ``again``: False when the
    CUDA kernel found that no remembered call had these objects (nothing to compare here).

    The last argument sets are held (as the typed call's memo holds its slots): compared by
    ``id()`` alone, a tensor freed after one call (a compiled graph's intermediate) and the next
    call's new one at the same address would pass for the same, and be bound every other call."""
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
    kargs = _reinterpreted(spec, args) if spec.reinterpret else args
    if not _loaded(spec, dev):
        _first_use(spec, dev)
    kernel = spec.kernel
    if written is None:
        written = tuple([args[j] for j in spec.written])
    if not spec.tensors:
        kernel(threads, *kargs, stream=st)
        return
    seen = spec.seen
    if again:
        again = False
        for d, sh, prev in seen:
            if d == dev and sh == h and (all(map(is_, args, prev)) or all(map(_same, args, prev))):
                again = True
                break
    if not again or any(args[j].is_inference() for j in spec.tensors):
        if not again:
            spec.seen = ((dev, h, args), *seen[:_SEEN_MAX - 1])
        kernel(threads, *kargs, stream=st)
        if written:
            _bump(written)  # type: ignore[misc]
        return
    tensors = tuple([args[j] for j in spec.tensors])
    b = _Bound(args, tensors, written, dev, h, kernel.bind(*kargs, stream=st))
    before = tuple(t._version for t in tensors)
    b.launch(threads)
    if written:
        _bump(written)  # type: ignore[misc]
    b.versions = tuple(t._version for t in tensors)
    b.deltas = tuple(map(int.__sub__, b.versions, before))
    spec.fast = (b, *spec.fast[:_FAST_MAX - 1])
    spec.last = b


def _make_impl(spec: _OpSpec) -> Callable[..., None]:
    """The kernel for every device but CUDA (``CompositeExplicitAutograd``): the launch, which
    refuses the tensors by name."""
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
# Triton instance families (khal_runtime.torch_triton: the spec, its schema and fake checks)
# ---------------------------------------------------------------------------------------------
def _make_triton_cuda_impl(spec: TritonOpSpec) -> Callable[..., None]:
    """The kernel at the ``CUDA`` key of a Triton family's operator: ``family[grid](*args,
    stream=<PyTorch's current stream of the tensors' device>)``, then the version bump of every
    tensor the schema declares written (a pointer some variant may write). The family's own call checks and chooses (dtypes, alignment,
    the assumptions its variants make, the grid; an autotuned family times or refuses inside a
    capture) and remembers a repeated launch: the grid is handed over as one tuple object per
    value, so that memo sees a repeat as one (it takes ints and floats equal to the last ones)."""
    pointers = spec.pointers
    written = spec.written
    grids = spec.grids
    torch = _torch()

    def cuda_impl(grid: Any, *args: Any) -> None:
        if not 0 < len(grid) <= 3:
            check_fake(spec, grid, args)  # the named error
        dev = -1
        for i in pointers:
            a = args[i]
            if a is not None:
                d = a.get_device()
                if d >= 0:  # (a CPU tensor: the family names it)
                    if dev < 0:
                        dev = d
                    elif d != dev:
                        raise other_device(spec, i, a, f"cuda:{dev}")
        if dev < 0:
            dev = torch.cuda.current_device()
        h = _raw_stream(dev)  # type: ignore[misc]  # set by _torch()
        st = _streams.get((dev, h))
        if st is None:
            st = _stream_for(spec, dev, h)
        if not _loaded(spec, dev):
            _first_use(spec, dev)
        key = tuple(grid)
        g = grids.get(key)
        if g is None:
            g = key
            if len(grids) < 64:
                grids[key] = key
        spec.kernel.launch(g, *args, stream=st)
        if written:
            _bump(tuple([args[i] for i in written if args[i] is not None]))  # type: ignore[misc]

    cuda_impl.__name__ = spec.op_name
    cuda_impl.__qualname__ = f"khal_op_cuda[{spec.qualname}]"
    return cuda_impl


def _make_triton_impl(spec: TritonOpSpec) -> Callable[..., None]:
    """The kernel for every device but CUDA (``CompositeExplicitAutograd``): refuses the first
    tensor that is not on a CUDA device, by name."""
    def impl(grid: Any, *args: Any) -> None:
        _triton_elsewhere(spec, grid, args)

    impl.__name__ = spec.op_name
    impl.__qualname__ = f"khal_op[{spec.qualname}]"
    return impl


def _triton_elsewhere(spec: TritonOpSpec, grid: Any, args: tuple[Any, ...]) -> None:
    """A Triton family's operator called on tensors of another device: the first one not on
    CUDA is refused by name."""
    for i in spec.pointers:
        a = args[i]
        if a is not None and not a.is_cuda:
            raise not_cuda(spec, i, a)
    raise ArgumentError(f"{spec.where}: khal kernels run on CUDA tensors; got none")


def _make_triton_fake(spec: TritonOpSpec) -> Callable[..., None]:
    def fake(grid: Any, *args: Any) -> None:
        check_fake(spec, grid, args)

    fake.__name__ = f"{spec.op_name}_fake"
    return fake


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
    models = sys.modules.get("khal_runtime.manifest")  # (a pydantic Entry exists only once that is imported)
    if isinstance(op, _EntryRecord) or models is not None and isinstance(op, models.Entry):
        return cast("Entry", op), str(op.name)  # (a loaded package's entries are records: manifest_load)
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

