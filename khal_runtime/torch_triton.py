"""A Triton instance family (:class:`~khal_runtime.triton.TritonKernel`) as a PyTorch operator:
what :mod:`khal_runtime.torch` needs beside its CUDA C++ / Slang entries (docs/guide/triton.md).

The operator takes what ``k[grid](*args)`` takes::

    torch.ops.<namespace>.<family>(SymInt[] grid, <one argument per runtime argument>) -> ()

``grid`` is the number of programs (1 to 3 dimensions, as ``k[grid]`` takes it), each pointer
argument a ``Tensor``, each integer a ``SymInt``, each float a ``float``, an ``i1`` a ``bool``;
the family's constexprs are compiled in and its two scratch pointers are the family's own, so
neither is an argument. A pointer some variant of the family may write is a mutated
``Tensor(aN!)`` (version-bumped after each launch); one the build proved every variant only
reads (``TritonFacts.written``, from Triton's IR: ``hatch_khal.triton.effects``) is a plain
``Tensor``, so ``torch.compile`` does not copy it and autograd does not see it modified. An entry
without the proof (a manifest built before it, an IR the analysis could not read) declares every
pointer mutated.

Everything here is computed without torch (the names the schema parser accepts are checked by
a callable :mod:`khal_runtime.torch` passes); the operator's kernels are made there, beside the
CUDA C++ ones, with the same stream, first-use and version-bump rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.triton import TritonKernel, _grid_reader

__all__ = ["TritonOpSpec", "check_fake", "check_grid", "not_cuda", "other_device", "triton_spec"]

#: grid launchers a spec keeps (tuple -> the one tuple object the family's memo recognises)
_GRIDS_MAX = 64


def _scalar_schema(t: str) -> str:
    """Schema type of a Triton scalar type (``i1`` a bool, ``fp16`` .. ``fp64`` / ``bf16`` a float,
    every integer a ``SymInt``: a size computed under ``torch.compile(dynamic=True)`` passes)."""
    if t == "i1":
        return "bool"
    if t.startswith(("fp", "bf")):
        return "float"
    return "SymInt"


@dataclass
class TritonOpSpec:
    """One Triton instance family as one operator."""

    namespace: str
    op_name: str
    crate: str
    #: the family (``kernels.crates[crate][entry_name]``)
    kernel: TritonKernel
    #: its first variant's entry (what :func:`khal_runtime.torch.uniform` reads: no uniforms)
    entry: Any
    #: the schema's argument names: the grid's, then one per runtime argument
    arg_names: tuple[str, ...]
    schema: str
    mutates: tuple[str, ...]
    #: indexes (among the runtime arguments) of the pointers, and the dtype name each must have
    #: (None: not checked, as the family checks none: the fp8 kinds)
    pointers: tuple[int, ...]
    dtypes: tuple[str | None, ...]
    #: indexes of the pointers some variant may write (declared mutated, bumped after each launch)
    written: tuple[int, ...] = ()
    #: ``torch.ops.<namespace>.<op>``
    packet: Any = None
    #: the crate the family is in
    crate_kernels: Any = None
    #: grid tuple -> the one object the family's memo keeps seeing (the dispatcher gives a new list each call)
    grids: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict)

    @property
    def entry_name(self) -> str:
        return self.kernel.name

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.op_name}"

    @property
    def where(self) -> str:
        return f"torch.ops.{self.namespace}.{self.op_name}() (Triton kernel {self.crate}.{self.kernel.name})"

    def describe(self, i: int) -> str:
        """Runtime argument ``i`` as errors name it."""
        return f"{self.where}: argument {self.kernel.arg_names[i]!r} ({self.kernel.types[i]})"

    def forget(self) -> None:
        """Drop what was kept for a previous load's family."""
        self.grids.clear()


def triton_spec(valid_name: Callable[[str], bool], namespace: str, op_name: str, family: TritonKernel) -> TritonOpSpec:
    """The operator of ``family``: ``(SymInt[] grid, <runtime arguments>) -> ()``. ``valid_name``:
    whether the schema parser takes a name as an argument name (else ``_`` is appended)."""
    taken = set(family.arg_names)
    grid = next(n for n in ("grid", "khal_grid", "khal_grid_", "khal_grid__") if n not in taken)
    names = [grid]
    parts = [f"SymInt[] {grid}"]
    mutates = []
    written: list[int] = []
    pointers = []
    dtypes = []
    for i, (n, t) in enumerate(zip(family.arg_names, family.types)):
        while not valid_name(n) or n in names:
            n += "_"
        names.append(n)
        if t.startswith("*"):
            if family.may_write(i):
                parts.append(f"Tensor(a{i}!) {n}")
                mutates.append(n)
                written.append(i)
            else:
                parts.append(f"Tensor {n}")
            pointers.append(i)
            dtypes.append(family.pointee_dtype(i))
        else:
            parts.append(f"{_scalar_schema(t)} {n}")
    return TritonOpSpec(namespace, op_name, family.crate, family, family.entry, tuple(names),
                        f"({', '.join(parts)}) -> ()", tuple(mutates), tuple(pointers), tuple(dtypes),
                        written=tuple(written))


def check_grid(spec: TritonOpSpec, grid: Sequence[Any]) -> None:
    """A grid of 1 to 3 dimensions; its values, where they are ints, checked as ``k[grid]`` checks
    them (the family's named errors). Symbolic sizes are left to the launch."""
    fam = spec.kernel
    if not 0 < len(grid) <= 3:
        raise ArgumentValueError(f"{spec.where}: grid: expected 1 to 3 dimensions (programs along x, y, z), "
                                 f"got {list(grid)}")
    if all(type(g) is int for g in grid):
        _grid_reader(fam, fam.variants[0])(tuple(grid))


def other_device(spec: TritonOpSpec, i: int, t: Any, device: Any) -> ArgumentValueError:
    return ArgumentValueError(f"{spec.describe(i)} is on {t.device}, an earlier tensor argument on {device}: "
                              "every tensor of one launch must be on the same device")


def not_cuda(spec: TritonOpSpec, i: int, t: Any) -> ArgumentError:
    return ArgumentError(f"{spec.describe(i)} is a tensor on {t.device}; khal kernels run on CUDA tensors: "
                         "move it with .cuda()")


def check_fake(spec: TritonOpSpec, grid: Sequence[Any], args: Sequence[Any]) -> None:
    """What the fake implementation checks without data: the grid, one device for every tensor,
    each tensor's dtype against its pointer's type (the family's ArgumentError). Alignment and
    the variant are the launch's."""
    check_grid(spec, grid)
    fam = spec.kernel
    device = None
    for i, want in zip(spec.pointers, spec.dtypes):
        a = args[i]
        if a is None:
            continue
        if device is None:
            device = a.device
        elif a.device != device:
            raise other_device(spec, i, a, device)
        if want is not None:
            fam.check_dtype(i, a.dtype)
