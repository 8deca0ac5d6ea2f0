"""The Python source generated for each launch plan (:class:`.launch.LaunchPlan`).

Two functions per plan and device, compiled with ``exec`` from a :class:`CodeSpec` (the plan's
code-generation state, frozen: the entry's parameter kinds, the types learnt, validated integers;
never user strings), each at most once per state:

- ``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: the explicit launch. It reads, checks
  and packs every argument into this thread's scratch block.
- the kernel's call ``(n, a0, a1, ..., stream=None)``, three paths, fastest first:

  1. the shared snapshots (``snapshots``, ``SLOTS`` of them, newest first): launches that
     were repeated before, in any thread, with the same argument objects, thread count and
     stream, and each torch tensor at the version and pointer it had then. A snapshot's
     argument block is never written again and it holds the whole argument tuple of the
     launch call, so threads share it without a lock; the stream came from this thread's
     ``ready`` (its device is current here).
  2. this thread's memo slots (the last ``SLOTS`` distinct argument sets it launched, the
     same check): the block packed then is reused; host uniforms are re-read (a ctypes
     struct can change in place) and re-packed only if their bytes changed. A slot hit
     ``PROMOTE_AFTER`` times becomes a shared snapshot.
  3. the full read, check and pack into the least recently filled slot, which is then
     remembered, when every argument is of a kind that cannot change under the same
     identity unnoticed (``interop.STABLE_ARRAY_TYPES``, torch tensors with a version
     counter: ``interop.VERSIONED_ARRAY_TYPES``, immutable scalars, re-readable uniforms);
     in a plan that has seen torch tensors, only the second time the same objects come
     (a new tensor every call is never stored: :func:`memo_store_lines`).

Anything off these paths goes to the generic slow path (``khal_runtime.calls.slow_call``, by
name: an argument type the call was not made for raises ``Restate`` inside the read and goes
there too, which makes the plan's call again) or to ``diagnose``, which names the bad argument.
``memo.bump_epoch`` (a free, a uniform-cache flush) clears every memo slot and snapshot at once. Each parameter's lines come from its reader's :class:`CudaReader`
(:data:`READERS`, one per ``abi.READERS``), chosen when the plan is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from khal_runtime import abi
from khal_runtime.arguments import blocks_source

if TYPE_CHECKING:
    from khal_runtime.manifest import Entry

#: memo slots per thread and shared snapshots per plan (distinct argument sets remembered)
SLOTS = 4
#: threads one typed call may launch on its fast path (more: the slow path checks the grid limit)
MAX_FAST_THREADS = 2**31 - 1
#: hits of a thread's memo slot that make it a shared snapshot (then counted again from 0, so
#: threads cycling through more argument sets than SLOTS promote at most once per this many)
PROMOTE_AFTER = 8

class MemoLayout:
    """The fields of a memo slot and of a shared snapshot of ``plan``, and a class for each
    (``__slots__`` classes made per plan, so the generated code reads ``m.stream``, ``k.gx``).

    A memo slot (this thread's, rewritten on every full read): ``a0 .. a{P-1}`` (the argument
    objects), ``stream`` (also its valid flag), ``n``, ``gx``, per uniform ``reader{i}`` and
    ``bytes{i}``, per storage ``version{i}``, ``pointer{i}``, ``storage{i}``, ``dtype{i}`` and
    ``count{i}``, then ``buf`` (the argument block), ``addr`` (the ``void*[]`` address), ``hits`` and
    ``ptrs``.
    A shared snapshot (never written after it is made): ``a0 .. a{P-1}``, ``stream``, ``n``,
    ``call`` (the launch call's whole argument tuple), ``gx``, ``addr``, the same per-uniform and
    per-storage fields, and ``keep`` (what must outlive it).
    The version is None for an array type that cannot change (``interop.STABLE_ARRAY_TYPES``),
    else the tensor's ``_version`` when it was packed (``interop.VERSIONED_ARRAY_TYPES``), or
    ``interop.UNVERSIONED`` for a tensor without a version counter (an inference tensor: its count
    and contiguity are compared instead).
    A thread's slots live in ``plan_tls.s``, a :class:`ThreadSlots`.
    """

    def __init__(self, entry: Entry, readers: list[CudaReader]) -> None:
        P = len(entry.params)  # noqa: N806
        self.P = P
        self.args = [f"a{i}" for i in range(P)]
        self.uniform = [i for i, reader in enumerate(readers) if reader.uniform]
        self.tensor = [i for i, reader in enumerate(readers) if reader.array]
        per_param = [n for i in self.uniform for n in (f"reader{i}", f"bytes{i}")]
        per_param += [n for i in self.tensor for n in (f"version{i}", f"pointer{i}", f"storage{i}", f"dtype{i}",
                                                        f"count{i}")]
        self.slot_fields = (*self.args, "stream", "n", "gx", *per_param, "buf", "addr", "hits", "ptrs")
        self.snapshot_fields = (*self.args, "stream", "n", "call", "gx", "addr", *per_param, "keep")
        self.Slot = type("MemoSlot", (), {"__slots__": self.slot_fields})
        self.Snapshot = type("Snapshot", (), {"__slots__": self.snapshot_fields})

    def snapshot(self, **fields: object) -> object:
        """A snapshot with ``fields`` (the others NOMEMO-like: given by the caller)."""
        snap = self.Snapshot()
        for k, v in fields.items():
            setattr(snap, k, v)
        return snap


class ThreadSlots:
    """One thread's memo slots of one plan: ``all`` (the SLOTS slots, also as ``s0``..),
    ``victim`` (the slot the next full read fills), ``scratch`` (the explicit launch's, which no
    memo uses), ``filled`` (whether any slot was ever filled), and ``recent`` / ``rnext``: the
    argument tuples of the last SLOTS full reads that stored no slot, and the one to replace next
    (a full read stores a slot only for arguments one of them had: :func:`memo_store_lines`)."""

    __slots__ = ("all", *(f"s{j}" for j in range(SLOTS)), "victim", "scratch", "filled", "owner",
                 "recent", "rnext")

    all: tuple[Any, ...]
    victim: int
    recent: list[tuple[Any, ...]]
    rnext: int
    scratch: Any
    filled: bool
    owner: Any


@dataclass(frozen=True)
class CodeSpec:
    """What the generated code of one plan is made from: the plan's code-generation state,
    frozen when the code is made (:meth:`.launch.LaunchPlan.spec`), so the code reads nothing of
    the plan but what is here and the names of :func:`spec_names` (and the namespace the plan
    passes: its functions, the driver's)."""

    entry: Entry
    device_id: int
    #: the compiled block, and the typed call's dynamic shared memory (KHAL_SHARED_MEM, else 0)
    block: tuple[int, int, int]
    shared: int
    #: per parameter, its reader's implementation (:data:`READERS`)
    readers: tuple[CudaReader, ...]
    #: byte offset in the argument block of each ABI slot
    offsets: tuple[int, ...]
    #: per parameter, the array types whose read is inlined, with their records (``ArrayT{i}_{j}``)
    inline: tuple[tuple[tuple[type, Any], ...], ...]
    #: per parameter, the uniform types converted inline, and how (``StructT{i}_{j}``:
    #: "ctypes" / "bytes" host structs; a device array type's record: its inline read)
    uinline: tuple[tuple[tuple[type, Any], ...], ...]
    #: storage parameters that have seen a versioned array (torch): their memos check it
    versioned: frozenset[int]
    #: those of them that have seen one without a version counter (a torch inference tensor): their
    #: memos compare its pointer, dtype, count and contiguity instead (the others pay no branch)
    unversioned: frozenset[int]
    #: the fields of memo slots and snapshots
    memo: MemoLayout
    #: launch hooks installed: every launch goes through ``hooks.dispatch``
    hooked: bool
    #: launches carry attributes (cuLaunchKernelEx, its list prebuilt: ``launch_ex``)
    needs_ex: bool
    #: the entry has a cooperative / cluster grid check (``check_attrs``)
    attrs_check: bool
    #: the plan's state counter when this was frozen: a call made from it that meets an argument
    #: type it does not inline sees whether the plan has learnt since (``Restate``)
    gen: int
    #: a ``run`` for a cluster given at launch (its ``launch_ex`` carries the cluster attribute,
    #: its ``check_attrs`` the grid check)
    clustered: bool = False


def spec_names(spec: CodeSpec) -> dict[str, type]:
    """The names the code of ``spec`` gives its inlined types."""
    out: dict[str, type] = {}
    for i, types in enumerate(spec.inline):
        for j, (tp, _) in enumerate(types):
            out[f"ArrayT{i}_{j}"] = tp
    for i, structs in enumerate(spec.uinline):
        for j, (tp, _) in enumerate(structs):
            out[f"StructT{i}_{j}"] = tp
    return out


# -- argument reading ------------------------------------------------------------------------------
def uniform_slots(spec: CodeSpec) -> dict[int, int]:
    """Parameter index -> byte offset in the argument block, of each uniform."""
    out, slot = {}, 0
    for i, p in enumerate(spec.entry.params):
        if spec.readers[i].uniform:
            out[i] = spec.offsets[slot]
        slot += p.abi_slots
    return out


def cached_upload(I: str, size: int) -> tuple[list[str], str]:  # noqa: E741, N803
    """Lines checking host bytes ``u`` against the uniform's size and looking them up in the
    uniform cache, and the expression for their device pointer (uploaded or waited for on
    ``st`` by ``fetch_uniform`` when not ready)."""
    return ([f"{I}if len(u) != {size}: raise Short()", f"{I}e = uniform_entries.get(u)"],
            "e.ptr if e is not None and e.pending is None else fetch_uniform(u, st)")


def seen_call(what: str, i: int, gen: int | None) -> str:
    """The call reading argument ``a{i}`` of a type the code does not inline: ``{what}_seen(i, a)``
    in ``run`` (the plan learns the type), ``{what}_unseen(i, a, gen)`` in the kernel's call
    (``Restate`` if the plan would learn it, or has learnt since state ``gen``)."""
    return f"{what}_seen({i}, a{i})" if gen is None else f"{what}_unseen({i}, a{i}, {int(gen)})"


def uniform_param_lines(spec: CodeSpec, i: int, I: str, gen: int | None) -> list[str]:  # noqa: E741, N803
    """Lines reading uniform ``a{i}`` into ``u{i}``, a device pointer to its bytes, and
    ``h{i}``, what its converter gave (bytes, or (pointer, size) of a device buffer)."""
    a, size = f"a{i}", int(spec.entry.params[i].element_size)
    mask = int(spec.entry.params[i].element_align) - 1
    align = f" or u[0] & {mask}" if mask > 0 else ""  # a struct in device memory, misaligned
    lines: list[str] = []
    if spec.uinline[i]:
        lines.append(f"{I}t = type({a})")
        for j, (_, kind) in enumerate(spec.uinline[i]):
            lines.append(f"{I}{'if' if j == 0 else 'elif'} t is StructT{i}_{j}:")
            if isinstance(kind, str):
                lines.append(f"{I}    u = {'bytes(' + a + ')' if kind == 'ctypes' else a}")
                continue
            # a device array holding the struct (uniforms' device converter: pointer, bytes)
            lines += [f"{I}    " + ln.format(a=a, i=i, d=int(spec.device_id)) for ln in kind.inline]
            lines += [f"{I}    if (s := ITEMSIZE.get(k{i})) is None: s = itemsize_of(k{i})",
                      f"{I}    u = (p{i}, c{i} * s)"]
        lines += [f"{I}else:", f"{I}    u = {seen_call('uniform', i, gen)}"]
    else:
        lines.append(f"{I}u = {seen_call('uniform', i, gen)}")
    fetch, ptr = cached_upload(I + "    ", size)
    return lines + [
        f"{I}h{i} = u",
        f"{I}if u.__class__ is bytes:",
        *fetch,
        f"{I}    u{i} = {ptr}",
        f"{I}else:",
        f"{I}    if u[1] < {size}{align}: raise Short()",
        f"{I}    u{i} = u[0]",
    ]


def _read_array(spec: CodeSpec, i: int, p: Any, I: str, lines: list[str],  # noqa: E741, N803
                by_mask: dict[int, list[str]], gen: int | None) -> list[str]:
    a = f"a{i}"
    lines += [
        f"{I}t{i} = type({a})",
        f"{I}if t{i} is DeviceBuffer:",
        f"{I}    p{i} = {a}.ptr; c{i} = {a}.size",
        f"{I}    if {a}.device_id != {int(spec.device_id)}: raise Short()",
        f"{I}    k{i} = {a}._et if {a}._base is None or {a}._base._et is not FREED else FREED",
    ]
    for j, (_, rec) in enumerate(spec.inline[i]):
        lines.append(f"{I}elif t{i} is ArrayT{i}_{j}:")
        lines += [f"{I}    " + ln.format(a=a, i=i, d=int(spec.device_id)) for ln in rec.inline]
    lines += [
        f"{I}else:",
        f"{I}    p{i}, c{i}, k{i} = {seen_call('storage', i, gen)}",
        f"{I}if k{i} not in accepted_{i}: learn_dtype({i}, k{i})",
    ]
    if int(p.element_align) > 1:
        by_mask.setdefault(int(p.element_align) - 1, []).append(f"p{i}")
    if p.shape == "array" and p.length:
        lines.append(f"{I}if c{i} < {int(p.length)}: raise Short()")
    elif p.shape == "value":
        lines.append(f"{I}if c{i} < 1: raise Short()")
    return [f"p{i}", f"c{i}"]


def _read_struct(spec: CodeSpec, i: int, p: Any, I: str, lines: list[str],  # noqa: E741, N803
                 by_mask: dict[int, list[str]], gen: int | None) -> list[str]:
    lines += uniform_param_lines(spec, i, I, gen)
    return [f"u{i}"]


def _read_value(spec: CodeSpec, i: int, p: Any, I: str, lines: list[str],  # noqa: E741, N803
                by_mask: dict[int, list[str]], gen: int | None) -> list[str]:
    return [scalar_pack_arg(p.element_type, i)]


@dataclass(frozen=True)
class CudaReader:
    """How the CUDA launch path reads an argument of one reader (:data:`READERS`), chosen once
    per plan (``CodeSpec.readers``): the generated code is the same as a branch would give."""

    name: str
    #: read through the interop records (inline array types, learnt dtypes); memoised by its
    #: type's stability or a tensor's version
    array: bool
    #: a uniform: uploaded through the cache, re-read on a memo hit (``launch.uniform_reader``)
    uniform: bool
    #: appends the lines reading ``a{i}`` and returns the ``pack_into`` arguments (``gen``: None in
    #: ``run``, the spec's state in the kernel's call: :func:`seen_call`)
    read: Callable[[CodeSpec, int, Any, str, list[str], dict[int, list[str]], int | None], list[str]]


#: the CUDA launch path's implementation of each reader
READERS: abi.ReaderTable[CudaReader] = abi.ReaderTable("khal_runtime.backends.cuda.launchgen", {
    "array": CudaReader("array", array=True, uniform=False, read=_read_array),
    "struct": CudaReader("struct", array=False, uniform=True, read=_read_struct),
    "value": CudaReader("value", array=False, uniform=False, read=_read_value),
})


def read_lines(spec: CodeSpec, I: str, gen: int | None) -> list[str]:  # noqa: E741, N803
    """Lines that read ``a0..`` and pack them into the block of slot ``m``. Sets ``t{i}``
    (storage types) and ``h{i}`` (uniforms as converted) on the way."""
    lines: list[str] = []
    pack_args: list[str] = []
    by_mask: dict[int, list[str]] = {}  # alignment - 1 -> the storage pointers that need it
    for i, p in enumerate(spec.entry.params):
        pack_args += spec.readers[i].read(spec, i, p, I, lines, by_mask, gen)
    # one test that every storage pointer just read is a multiple of its elements' alignment
    # (Param.element_align): a misaligned one is a sticky CUDA_ERROR_MISALIGNED_ADDRESS on the GPU.
    # Pointers of one alignment are or-ed together. Only after a read: a memo hit launches
    # pointers checked when they were read (a tensor's is compared with the one remembered).
    # (Loops, not comprehensions or a helper: the first call's frame budget, test_generated_code.)
    tests: list[str] = []
    for mask in sorted(by_mask):
        ps = by_mask[mask]
        tests.append(f"({' | '.join(ps)}) & {mask}" if len(ps) > 1 else f"{ps[0]} & {mask}")
    if tests:
        lines.append(f"{I}if {' or '.join(tests)}: raise Short()")
    if pack_args:
        lines.append(f"{I}pack_args(m.buf, 0, {', '.join(pack_args)})")
    return lines


def scalar_pack_arg(element_type: str, i: int) -> str:
    """What ``pack_args`` gets for scalar ``a{i}``: a plain value of the right Python type goes
    straight to ``struct``, anything else through ``scalar_value`` (the ABI's rules)."""
    a = f"a{i}"
    family = abi.SCALARS[element_type].family
    if element_type == "bool":  # struct's '?' would take any object's truth value
        return f"({a} if {a}.__class__ is bool else scalar_value({i}, {a}))"
    if element_type == "bfloat16":
        return f"scalar_value({i}, {a})"
    if family == "complex":
        return f"*scalar_value({i}, {a})"
    if family in ("int", "uint"):  # an int goes straight to struct
        return f"({a} if {a}.__class__ is int else scalar_value({i}, {a}))"
    # floats: a float or int straight to struct; NumPy numbers, bools, complex: the rules
    return f"({a} if {a}.__class__ is float or {a}.__class__ is int else scalar_value({i}, {a}))"


# -- memo slots ------------------------------------------------------------------------------------
def slots_lines(I: str) -> list[str]:  # noqa: E741, N803
    return [f"{I}try:", f"{I}    ms = plan_tls.s", f"{I}except AttributeError:", f"{I}    ms = new_slots()"]


def seen_before(spec: CodeSpec) -> str:
    """The condition that the arguments ``a0..`` are, object for object, those of one of this
    thread's last SLOTS full reads that stored no slot (``ms.recent``)."""
    out: list[str] = []
    for j in range(SLOTS):
        conds = [f"a0 is (r := R[{j}])[0]"]
        for i, a in enumerate(spec.memo.args[1:], 1):
            conds.append(f"{a} is r[{i}]")
        out.append("(" + " and ".join(conds) + ")")
    return " or ".join(out)


def memo_store_lines(spec: CodeSpec, I: str) -> list[str]:  # noqa: E741, N803
    """After a full read and pack into slot ``m`` (``v``: its index): remember the arguments.
    In the call of a plan that has seen torch tensors (``spec.versioned``), the second time a
    full read meets them (the same objects as one of the last SLOTS full reads that stored
    nothing, ``ms.recent``), not the first: a set seen once (a new tensor every call, a compiled
    graph's intermediate) could never hit, and storing it cost about as much as the read (each
    tensor's version and storage) and evicted a slot. A first sight is
    recorded in ``ms.recent`` instead (holding the objects, so that another object at a freed
    one's address is not taken for it) and sets ``ms.victim`` back to ``v`` (advanced before the
    read, so that a launch nested in it packs elsewhere): the next full read packs into the same
    slot, so a run of sets seen once evicts one slot, not all.

    A store happens only when every
    buffer is of a type that cannot change under the same identity (DeviceBuffer,
    cupy.ndarray: ``interop.STABLE_ARRAY_TYPES``) or, for the parameters that have seen a
    torch tensor (``spec.versioned``), a tensor with a version counter, whose version,
    pointer and storage are kept for the reuse check (``interop.tensor_memo``); every scalar
    is immutable (a 0-d NumPy array is not) and every uniform can be re-read
    (``launch.uniform_reader``). The stream is stored last, and only if nothing was freed
    since the arguments were read."""
    lo = spec.memo
    versioned = spec.versioned
    # (one failed condition skips the rest: an inference tensor costs one tensor_memo call)
    conds: list[str] = []
    for i, reader in enumerate(spec.readers):
        if reader.uniform:
            continue
        if i in versioned and i not in spec.unversioned:  # an inference tensor here: learnt, not stored
            conds.append(f"(q{i} := STABLE_MEMO if t{i} in STABLE_TYPES else tensor_memo(a{i})) is not None "
                         f"and (q{i}[0] is not UNVERSIONED or unversioned_seen({i}))")
            continue
        conds.append(f"(q{i} := STABLE_MEMO if t{i} in STABLE_TYPES else tensor_memo(a{i})) is not None"
                     if i in versioned else f"t{i} in STABLE_TYPES" if reader.array
                     else f"IMMUTABLE_SCALAR[type(a{i})]")
    body: list[str] = []
    ucond: list[str] = []
    inner: list[str] = []
    for i in lo.uniform:
        body.append(f"r{i} = uniform_reader(a{i}, h{i})")
        ucond.append(f"r{i} is not NOMEMO")
        inner.append(f"m.reader{i} = r{i}; m.bytes{i} = h{i}")
    for i in lo.tensor:
        inner.append(f"m.version{i} = q{i}[0]; m.pointer{i} = p{i}; m.storage{i} = q{i}[1]; m.dtype{i} = k{i}; "
                     f"m.count{i} = c{i}" if i in versioned else f"m.version{i} = None")
    stores: list[str] = []
    for a in lo.args:
        stores.append(f"m.{a} = {a}")
    inner += ["; ".join(stores), "m.n = n; m.gx = gx; m.hits = 0; ms.filled = True",
              "if ep == EPOCH[0]: m.stream = st"]
    out: list[str] = []
    K = I  # noqa: N806
    if versioned:  # (a plan that has seen no tensor stores at once: its stores read nothing)
        K = I + "    "  # noqa: N806
        out += [f"{I}R = ms.recent", f"{I}if {seen_before(spec)}:"]
    J = K  # noqa: N806
    if conds:
        out.append(f"{K}if {' and '.join(conds)}:")
        J = K + "    "  # noqa: N806
    for ln in body:
        out.append(J + ln)
    if ucond:
        out.append(f"{J}if {' and '.join(ucond)}:")
        J = J + "    "  # noqa: N806
    for ln in inner:
        out.append(J + ln)
    if not versioned:
        return out
    out += [f"{I}else:",
            f"{K}j = ms.rnext",
            f"{K}R[j] = ({''.join(a + ', ' for a in spec.memo.args)})",
            f"{K}ms.rnext = j + 1 if j < {SLOTS - 1} else 0",
            f"{K}ms.victim = v"]
    return out


# (The conditions below are built with loops, once per function, not comprehensions per slot:
# a first call makes them, and each comprehension is a frame of its budget, test_generated_code.)
def tensor_unchanged(spec: CodeSpec, m: str) -> list[str]:
    """Each tensor the memo ``m`` holds (for the parameters that have seen one) has the
    version, pointer and dtype it had when packed (``.data =`` a view of another dtype at the same
    address keeps the other two); one without a version counter (an inference tensor,
    ``UNVERSIONED``) the pointer, dtype, count and contiguity (what an in-place op can change under
    the same identity: ``resize_``, ``t_``, ``.data =``). An array of a stable type has version None."""
    out: list[str] = []
    for i in spec.memo.tensor:
        if i in spec.unversioned:
            out.append(f"((ver := {m}.version{i}) is None or (a{i}._version == ver if ver is not UNVERSIONED else "
                       f"a{i}.numel() == {m}.count{i} and a{i}.is_contiguous()) and a{i}.data_ptr() == {m}.pointer{i} "
                       f"and a{i}.dtype is {m}.dtype{i})")
        elif i in spec.versioned:  # (never an UNVERSIONED one: memo_store_lines; the version read once)
            out.append(f"((ver := {m}.version{i}) is None or (a{i}._version == ver and a{i}.data_ptr() == "
                       f"{m}.pointer{i} and a{i}.dtype is {m}.dtype{i}))")
    return out


def slot_hits(spec: CodeSpec) -> list[str]:
    """Per slot ``j``: slot ``j`` of this thread holds this launch's argument objects for this stream."""
    conds = ["a0 is (m := ms.s{J}).a0"]  # (>= 1 argument: entries without parameters have no memo)
    for a in spec.memo.args[1:]:
        conds.append(f"{a} is m.{a}")
    conds += ["st is m.stream", "not _more"]
    hit = " and ".join(conds + tensor_unchanged(spec, "m"))
    out: list[str] = []
    for j in range(SLOTS):
        out.append(hit.replace("{J}", str(j), 1))
    return out


def snapshot_hits(spec: CodeSpec) -> list[str]:
    """Per snapshot ``j``: shared snapshot ``j`` is this very launch (arguments, stream, thread
    count, uniforms' current bytes)."""
    lo = spec.memo
    conds = ["a0 is (k := snapshots[{J}]).a0"]
    for a in lo.args[1:]:
        conds.append(f"{a} is k.{a}")
    conds += ["st is k.stream", "n is k.n", "not _more"]
    conds += tensor_unchanged(spec, "k")
    for i in lo.uniform:  # (the reader read once)
        conds.append(f"((rdr := k.reader{i}) is None or rdr(a{i}) == k.bytes{i})")
    hit = " and ".join(conds)
    out: list[str] = []
    for j in range(SLOTS):
        out.append(hit.replace("{J}", str(j), 1))
    return out


def uniform_recheck_lines(spec: CodeSpec, I: str) -> list[str]:  # noqa: E741, N803
    """Slot hit: a host uniform may have new bytes under the same identity; re-read it, and
    re-pack its device pointer only if they changed."""
    offs = uniform_slots(spec)
    lines: list[str] = []
    for i in spec.memo.uniform:
        fetch, ptr = cached_upload(I + "        ", int(spec.entry.params[i].element_size))
        lines += [
            f"{I}r = m.reader{i}",
            f"{I}if r is not None:",
            f"{I}    u = r(a{i})",
            f"{I}    if u != m.bytes{i}:",
            *fetch,
            f"{I}        pack_u64(m.buf, {offs[i]}, {ptr})",
            f"{I}        m.bytes{i} = u",
        ]
    return lines


def guarded_chain(spec: CodeSpec, I: str, chain: list[str], on_error: list[str]) -> list[str]:  # noqa: E741, N803
    """The memo checks ``chain`` at indent ``I``; where they read tensors, inside a ``try``
    (free in CPython 3.11+ until something raises) whose handler runs ``on_error``."""
    if not spec.versioned:
        return [I + "\n".join(chain).replace("\n", "\n" + I)]
    J = I + "    "  # noqa: N806
    return [f"{I}try:", J + "\n".join(chain).replace("\n", "\n" + J), f"{I}except Exception:",
            J + "\n".join(on_error).replace("\n", "\n" + J)]


# -- the two functions ---------------------------------------------------------------------------
def launch_lines(g: str, b: str, shmem: str, args: str, hooked: bool, ex: bool = False) -> list[str]:
    """The driver call; ``ex``: the entry has launch attributes (``launch_ex``: cuLaunchKernelEx with
    a per-thread configuration already holding their list, :func:`.attributes.make_launch_ex`)."""
    call = (f"launch_ex(function, {g}, {b}, {shmem}, st.native, addr)" if ex
            else f"cuLaunchKernel(function, {g}, {b}, {shmem}, st.native, addr, 0)")
    if hooked:  # regenerated when hooks are installed or removed
        return [
            f"    return hooks.dispatch(plan, ({g}), ({b}), {shmem}, st, {args},",
            f"                          lambda: launch_failed({call}[0], {g}, {b}))",
        ]
    return [
        f"    r = {call}",
        "    if r[0]:",
        f"        launch_failed(r[0], {g}, {b})",
    ]


def attrs_check_line(spec: CodeSpec, I: str, g: str, threads: str, shmem: str) -> list[str]:  # noqa: E741, N803
    """The cooperative / cluster grid check (:meth:`.attributes.FunctionAttributes.check_launch`),
    only for entries that have one (a clustered ``run`` always has)."""
    return [f"{I}check_attrs({g}, {threads}, {shmem})"] if spec.attrs_check or spec.clustered else []


def run_source(spec: CodeSpec) -> str:
    """``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: packs into this thread's scratch
    slot, which no memo uses."""
    n = len(spec.entry.params)
    I = "        "  # noqa: E741, N806
    names = [f"a{i}" for i in range(n)]
    lines = ["def run(gx, gy, gz, bx, by, bz, shmem, st, args):", "    try:"]
    if n:
        lines.append(f"{I}{', '.join(names)}{',' if n == 1 else ''} = args")
        lines += slots_lines(I)
        lines.append(f"{I}m = ms.scratch")
        lines += read_lines(spec, I, None)
        lines.append(f"{I}addr = m.addr")
    else:
        lines += [f"{I}if args: raise Short()", f"{I}addr = 0"]
    lines += ["    except Exception as exc:", "        diagnose(args, exc)", "        raise"]
    lines += attrs_check_line(spec, "    ", "gx, gy, gz", "bx * by * bz", "shmem")
    lines += launch_lines("gx, gy, gz", "bx, by, bz", "shmem", "args", spec.hooked, spec.clustered or spec.needs_ex)
    return "\n".join(lines) + "\n"


def call_source(spec: CodeSpec) -> str:
    """The kernel's call ``(n, a0=MISSING, ..., *_more, stream=None)`` for ``spec``'s device;
    anything off the fast paths (another device, a non-positive or non-int thread count,
    missing or extra arguments, an argument type it does not inline that the plan would learn:
    ``Restate``) goes to ``slow_call(kernel, n, args, st)``."""
    lo = spec.memo
    hooked = spec.hooked
    D = int(spec.device_id)  # noqa: N806
    bx, by, bz = spec.block
    P = lo.P  # noqa: N806
    names = lo.args
    sig, tup = "", "("
    for a in names:
        sig += f"{a}=MISSING, "
        tup += f"{a}, "
    tup += ")"
    lines = [
        f"def __call__(n, {sig}*_more, stream=None):",
        "    if stream is None:",
        "        try:",
        "            st = thread.ready",
        "        except AttributeError:",
        "            st = None",
        "        if st is None:",  # outside the handler: an error here (no GPU) comes unchained
        "            st = ready_stream()",
        "    else:",
        "        st = stream if type(stream) is Stream else as_stream(stream)",
        "        try:",
        "            cur = thread.dev",
        "        except AttributeError:",
        "            cur = -1",
        "        if cur != st.device_id:",
        "            ensure_current(st.device_id)",
    ]
    guard = (f"st.device_id != {D} or type(n) is not int or n <= 0 or n > {MAX_FAST_THREADS} or _more"
             + (f" or {names[-1]} is MISSING" if names else ""))
    to_slow = f"return slow_call(kernel, n, tuple(a for a in {tup} if a is not MISSING) + _more, st)"
    sh = int(spec.shared)  # the entry's dynamic shared memory (KHAL_SHARED_MEM), else 0
    threads = bx * by * bz
    ex = spec.needs_ex
    # the cooperative / cluster grid check, for entries that have one (no comprehension: frame budget)
    chk = f"check_attrs(gx, 1, 1, {threads}, {sh})" if spec.attrs_check else ""
    if not P:
        lines += [f"    if {guard}:", f"        {to_slow}", "    addr = 0", f"    gx = {blocks_source('n', bx)}"]
        if chk:
            lines.append("    " + chk)
        lines += launch_lines("gx, 1, 1", f"{bx}, {by}, {bz}", str(sh), tup, hooked, ex)
        return "\n".join(lines) + "\n"

    # arguments no memo can hold (a host array first) skip the memos after one failed check
    s0 = None
    for i, reader in enumerate(spec.readers):
        if reader.array:
            s0 = i
            break
    unstable = "" if s0 is None else f" or type(a{s0}) not in MEMO_TYPES"
    # 1. shared snapshots (filled newest first: an empty first one means none)
    chain: list[str] = []
    for j, hit in enumerate(snapshot_hits(spec)):
        chain.append(f"{'if' if j == 0 else 'elif'} {hit}:")
        chain.append("    pass")
        if j == 0:
            chain += [f"elif k.a0 is NOMEMO{unstable}:", "    k = None"]
    chain += ["else:", "    k = None"]
    # a remembered tensor whose version can no longer be read (swapped with an inference
    # tensor): drop the memo being checked (``k``, set before anything can raise), read in full
    lines += guarded_chain(spec, "    ", chain, ["unshare(k)", "k = None"])
    lines += ["    if k is not None:"]
    if hooked:
        lines.append("        gx = k.gx; addr = k.addr")
    else:  # the snapshot holds the launch call's whole argument tuple
        lines += ["        r = launch_prepared(*k.call)", "        if r[0]:",
                  f"            launch_failed(r[0], k.gx, 1, 1, {bx}, {by}, {bz})", "        return"]
    lines.append("    else:")
    # 2. this thread's memo slots
    J = "        "  # noqa: N806
    I = J + "        "  # noqa: E741, N806
    lines += slots_lines(J)
    chain = []
    for j, hit in enumerate(slot_hits(spec)):
        chain.append(f"{'if' if j == 0 else 'elif'} {hit}:")
        chain.append("    pass")
        if j == 0:  # no slot was ever filled, or arguments that are read every time
            chain += [f"elif not ms.filled{unstable}:", "    m = None"]
    chain += ["else:", "    m = None"]
    lines += guarded_chain(spec, J, chain, ["m.stream = NOMEMO", "m = None"])
    lines += [
        f"{J}if m is not None:",
        f"{J}    if n is m.n:",  # the same thread count object: the same grid
        f"{J}        gx = m.gx",
        f"{J}    elif type(n) is int and 0 < n <= {MAX_FAST_THREADS}:",
        f"{J}        gx = {blocks_source('n', bx)}",
        *([J + "        " + chk] if chk else []),
        f"{J}        m.n = n; m.gx = gx",
        f"{J}    else:",
        f"{J}        {to_slow}",
    ]
    recheck = uniform_recheck_lines(spec, I)
    if recheck:
        lines += [f"{J}    try:"] + recheck
        lines += [f"{J}    except Exception as exc:", f"{J}        diagnose({tup}, exc)", f"{J}        raise"]
    lines += [
        f"{J}    h = m.hits + 1",
        f"{J}    if h >= {PROMOTE_AFTER}:",
        f"{J}        m.hits = 0",
        f"{J}        promote(m, st)",
        f"{J}    else:",
        f"{J}        m.hits = h",
        # 3. the full read into the least recently filled slot
        f"{J}else:",
        f"{J}    if {guard}:",
        f"{J}        {to_slow}",
        f"{J}    gx = {blocks_source('n', bx)}",
        *([J + "    " + chk] if chk else []),
        f"{J}    v = ms.victim",
        f"{J}    ms.victim = v + 1 if v < {SLOTS - 1} else 0",  # (back to v if nothing is stored)
        f"{J}    m = ms.all[v]",
        f"{J}    try:",
        f"{J}        ep = EPOCH[0]",
        f"{J}        m.stream = NOMEMO",
    ]
    lines += read_lines(spec, I, spec.gen)
    lines += memo_store_lines(spec, I)
    # a type to learn: the slow path makes the plan's call again (outside the handler: an error
    # there is not chained to Restate)
    lines += [f"{J}    except Restate:", f"{J}        m = None",
              f"{J}    except Exception as exc:", f"{J}        diagnose({tup}, exc)", f"{J}        raise",
              f"{J}    if m is None:", f"{J}        return slow_call(kernel, n, {tup}, st)"]
    lines.append(f"{J}addr = m.addr")
    lines += launch_lines("gx, 1, 1", f"{bx}, {by}, {bz}", str(sh), tup, hooked, ex)
    return "\n".join(lines) + "\n"
