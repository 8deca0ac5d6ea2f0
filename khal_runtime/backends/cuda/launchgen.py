"""The Python source generated for each launch plan (:class:`.launch.LaunchPlan`).

Two functions per plan and device, compiled with ``exec`` from the entry's parameter kinds
and validated integers only (never from user strings):

- ``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: the explicit launch. It reads, checks
  and packs every argument into this thread's scratch block.
- the kernel's call ``(n, a0, a1, ..., stream=None)``, three paths, fastest first:

  1. the shared snapshots (``plan._shared``, ``SLOTS`` of them, newest first): launches that
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
     counter: ``interop.VERSIONED_ARRAY_TYPES``, immutable scalars, re-readable uniforms).

Anything off these paths goes to the kernel's slow path or to ``diagnose``, which names the
bad argument. ``memo.bump_epoch`` (a free, a uniform-cache flush) clears every memo slot
and snapshot at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from khal_runtime import abi

if TYPE_CHECKING:
    from khal_runtime.backends.cuda.launch import LaunchPlan

#: memo slots per thread and shared snapshots per plan (distinct argument sets remembered)
SLOTS = 4
#: threads one typed call may launch on its fast path (more: the slow path checks the grid limit)
MAX_FAST_THREADS = 2**31 - 1
#: hits of a thread's memo slot that make it a shared snapshot (then counted again from 0, so
#: threads cycling through more argument sets than SLOTS promote at most once per this many)
PROMOTE_AFTER = 8

class MemoLayout:
    """Indices into one memo slot, a list:
    ``[arg 0 .. arg P-1, stream, n, gx, (reader, bytes) per uniform,
    (version, pointer, storage) per storage parameter, buf, addr, hits, ptrs]``
    (the stream is the slot's valid flag), and into one shared snapshot, a tuple:
    ``(arg 0 .. arg P-1, stream, n, call args, gx, addr, (reader, bytes) per uniform,
    (version, pointer, storage) per storage parameter, keep)``.
    The version is None for an array type that cannot change (``interop.STABLE_ARRAY_TYPES``),
    else the tensor's ``_version`` when it was packed (``interop.VERSIONED_ARRAY_TYPES``).
    A thread's slots live in ``plan._tls.s``:
    ``[slot 0 .. slot SLOTS-1, next victim, scratch, whether any slot was ever filled]``.
    """

    def __init__(self, plan: LaunchPlan) -> None:
        P = len(plan.entry.params)  # noqa: N806
        self.P = P
        self.stream, self.n, self.gx = P, P + 1, P + 2
        self.uniform: dict[int, tuple[int, int]] = {}  # param -> (reader, bytes) in a slot
        k = P + 3
        for i, reader in enumerate(plan.readers):
            if reader == "struct":
                self.uniform[i] = (k, k + 1)
                k += 2
        self.tensor: dict[int, tuple[int, int, int]] = {}  # param -> (version, ptr, storage)
        for i, reader in enumerate(plan.readers):
            if reader == "array":
                self.tensor[i] = (k, k + 1, k + 2)
                k += 3
        self.buf, self.addr, self.hits, self.ptrs, self.length = k, k + 1, k + 2, k + 3, k + 4
        # snapshot indices
        self.s_call, self.s_gx, self.s_addr = P + 2, P + 3, P + 4
        self.s_uniform = {i: (P + 5 + 2 * j, P + 6 + 2 * j) for j, i in enumerate(self.uniform)}
        k = P + 5 + 2 * len(self.uniform)
        self.s_tensor = {i: (k + 3 * j, k + 3 * j + 1, k + 3 * j + 2) for j, i in enumerate(self.tensor)}
        self.s_length = k + 3 * len(self.tensor) + 1


# -- argument reading ------------------------------------------------------------------------------
def uniform_slots(plan: LaunchPlan) -> dict[int, int]:
    """Parameter index -> byte offset in the argument block, of each uniform."""
    out, slot = {}, 0
    for i, p in enumerate(plan.entry.params):
        if plan.readers[i] == "struct":
            out[i] = plan._offsets[slot]
        slot += p.abi_slots
    return out


def cached_upload(I: str, size: int) -> tuple[list[str], str]:  # noqa: E741, N803
    """Lines checking host bytes ``u`` against the uniform's size and looking them up in the
    uniform cache, and the expression for their device pointer (uploaded or waited for on
    ``st`` by ``fetch_uniform`` when not ready)."""
    return ([f"{I}if len(u) != {size}: raise Short()", f"{I}e = uniform_entries.get(u)"],
            "e.ptr if e is not None and e.pending is None else fetch_uniform(u, st)")


def uniform_param_lines(plan: LaunchPlan, i: int, I: str) -> list[str]:  # noqa: E741, N803
    """Lines reading uniform ``a{i}`` into ``u{i}``, a device pointer to its bytes, and
    ``h{i}``, what its converter gave (bytes, or (pointer, size) of a device buffer)."""
    a, size = f"a{i}", int(plan.entry.params[i].element_size)
    lines = [f"{I}t = type({a})"]
    for j, kind in enumerate(plan._uinline[i].values()):
        lines.append(f"{I}{'if' if j == 0 else 'elif'} t is StructT{i}_{j}:")
        lines.append(f"{I}    u = {'bytes(' + a + ')' if kind == 'ctypes' else a}")
    fetch, ptr = cached_upload(I + "    ", size)
    return lines + [
        f"{I}{'else:' if plan._uinline[i] else 'if True:'}",
        f"{I}    u = uniform_seen({i}, {a})",
        f"{I}h{i} = u",
        f"{I}if u.__class__ is bytes:",
        *fetch,
        f"{I}    u{i} = {ptr}",
        f"{I}else:",
        f"{I}    if u[1] < {size}: raise Short()",
        f"{I}    u{i} = u[0]",
    ]


def read_lines(plan: LaunchPlan, I: str) -> list[str]:  # noqa: E741, N803
    """Lines that read ``a0..`` and pack them into the block of slot ``m``. Sets ``t{i}``
    (storage types) and ``h{i}`` (uniforms as converted) on the way."""
    lo = plan.memo
    lines: list[str] = []
    pack_args: list[str] = []
    for i, p in enumerate(plan.entry.params):
        a = f"a{i}"
        reader = plan.readers[i]
        if reader == "array":
            lines += [
                f"{I}t{i} = type({a})",
                f"{I}if t{i} is DeviceBuffer:",
                f"{I}    p{i} = {a}.ptr; c{i} = {a}.size",
                f"{I}    if {a}.device_id != {int(plan.device_id)}: raise Short()",
                f"{I}    k{i} = {a}._et if {a}._base is None or {a}._base._et is not FREED else FREED",
            ]
            for j, rec in enumerate(plan._inline[i].values()):
                lines.append(f"{I}elif t{i} is ArrayT{i}_{j}:")
                lines += [f"{I}    " + ln.format(a=a, i=i, d=int(plan.device_id)) for ln in rec.inline]
            lines += [
                f"{I}else:",
                f"{I}    p{i}, c{i}, k{i} = storage_seen({i}, {a})",
                f"{I}if k{i} not in accepted_{i}: learn_dtype({i}, k{i})",
            ]
            if p.shape == "array" and p.length:
                lines.append(f"{I}if c{i} < {int(p.length)}: raise Short()")
            elif p.shape == "value":
                lines.append(f"{I}if c{i} < 1: raise Short()")
            pack_args += [f"p{i}", f"c{i}"]
        elif reader == "struct":
            lines += uniform_param_lines(plan, i, I)
            pack_args.append(f"u{i}")
        elif p.element_type == "bool":  # struct's '?' would take any object's truth value
            pack_args.append(f"({a} if {a}.__class__ is bool else scalar_value({i}, {a}))")
        elif p.element_type == "bfloat16" or abi.SCALARS[p.element_type].family == "complex":
            pack_args.append(f"scalar_value({i}, {a})" if p.element_type == "bfloat16"
                             else f"*scalar_value({i}, {a})")
        else:  # struct's own checks refuse what abi.scalar_value refuses (str, None, float for int)
            pack_args.append(a)
    if pack_args:
        lines.append(f"{I}pack_args(m[{lo.buf}], 0, {', '.join(pack_args)})")
    return lines


# -- memo slots ------------------------------------------------------------------------------------
def slots_lines(I: str) -> list[str]:  # noqa: E741, N803
    return [f"{I}try:", f"{I}    ms = plan_tls.s", f"{I}except AttributeError:", f"{I}    ms = new_slots()"]


def memo_store_lines(plan: LaunchPlan, I: str) -> list[str]:  # noqa: E741, N803
    """After a full read and pack into slot ``m``: remember the arguments, only when every
    buffer is of a type that cannot change under the same identity (DeviceBuffer,
    cupy.ndarray: ``interop.STABLE_ARRAY_TYPES``) or, for the parameters that have seen a
    torch tensor (``plan._versioned``), a tensor with a version counter, whose version,
    pointer and storage are kept for the reuse check (``interop.tensor_memo``); every scalar
    is immutable (a 0-d NumPy array is not) and every uniform can be re-read
    (``launch.uniform_reader``). The stream is stored last, and only if nothing was freed
    since the arguments were read."""
    lo, P = plan.memo, plan.memo.P  # noqa: N806
    versioned = plan._versioned
    # (one failed condition skips the rest: an inference tensor costs one tensor_memo call)
    conds = [f"(q{i} := STABLE_MEMO if t{i} in STABLE_TYPES else tensor_memo(a{i})) is not None"
             if i in versioned else f"t{i} in STABLE_TYPES" if reader == "array"
             else f"IMMUTABLE_SCALAR[type(a{i})]"
             for i, reader in enumerate(plan.readers) if reader != "struct"]
    body = [f"r{i} = uniform_reader(a{i}, h{i})" for i in lo.uniform]
    ucond = [f"r{i} is not NOMEMO" for i in lo.uniform]
    inner = [f"m[{rs}] = r{i}; m[{bs}] = h{i}" for i, (rs, bs) in lo.uniform.items()]
    for i, (vs, ps, ks) in lo.tensor.items():
        inner.append(f"m[{vs}] = q{i}[0]; m[{ps}] = p{i}; m[{ks}] = q{i}[1]" if i in versioned
                     else f"m[{vs}] = None")
    inner += [f"m[0:{P}] = ({''.join(f'a{i}, ' for i in range(P))})",
              f"m[{lo.n}] = n; m[{lo.gx}] = gx; m[{lo.hits}] = 0; ms[{SLOTS + 2}] = True",
              f"if ep == EPOCH[0]: m[{lo.stream}] = st"]
    out: list[str] = []
    J = I  # noqa: N806
    if conds:
        out.append(f"{I}if {' and '.join(conds)}:")
        J = I + "    "  # noqa: N806
    out += [J + ln for ln in body]
    if ucond:
        out.append(f"{J}if {' and '.join(ucond)}:")
        J = J + "    "  # noqa: N806
    return out + [J + ln for ln in inner]


def tensor_unchanged(plan: LaunchPlan, m: str, where: dict[int, tuple[int, int, int]]) -> list[str]:
    """Each tensor the memo ``m`` holds (for the parameters that have seen one) has the
    version and pointer it had when packed (an array of a stable type has version None)."""
    return [f"({m}[{vs}] is None or (a{i}._version == {m}[{vs}] and a{i}.data_ptr() == {m}[{ps}]))"
            for i, (vs, ps, _) in where.items() if i in plan._versioned]


def slot_hit(plan: LaunchPlan, j: int) -> str:
    """Slot ``j`` of this thread holds this launch's argument objects for this stream."""
    P = plan.memo.P  # noqa: N806  (>= 1: entries without parameters have no memo)
    conds = [f"a0 is (m := ms[{j}])[0]"] + [f"a{i} is m[{i}]" for i in range(1, P)]
    conds += [f"st is m[{plan.memo.stream}]", "not _more"]
    return " and ".join(conds + tensor_unchanged(plan, "m", plan.memo.tensor))


def snapshot_hit(plan: LaunchPlan, j: int) -> str:
    """Shared snapshot ``j`` is this very launch (arguments, stream, thread count, uniforms'
    current bytes)."""
    lo, P = plan.memo, plan.memo.P  # noqa: N806
    conds = [f"a0 is (k := snapshots[{j}])[0]"] + [f"a{i} is k[{i}]" for i in range(1, P)]
    conds += [f"st is k[{P}]", f"n is k[{P + 1}]", "not _more"]
    conds += tensor_unchanged(plan, "k", lo.s_tensor)
    for i, (r, b) in lo.s_uniform.items():
        conds.append(f"(k[{r}] is None or k[{r}](a{i}) == k[{b}])")
    return " and ".join(conds)


def uniform_recheck_lines(plan: LaunchPlan, I: str) -> list[str]:  # noqa: E741, N803
    """Slot hit: a host uniform may have new bytes under the same identity; re-read it, and
    re-pack its device pointer only if they changed."""
    lo = plan.memo
    offs = uniform_slots(plan)
    lines: list[str] = []
    for i, (rs, bs) in lo.uniform.items():
        fetch, ptr = cached_upload(I + "        ", int(plan.entry.params[i].element_size))
        lines += [
            f"{I}r = m[{rs}]",
            f"{I}if r is not None:",
            f"{I}    u = r(a{i})",
            f"{I}    if u != m[{bs}]:",
            *fetch,
            f"{I}        pack_u64(m[{lo.buf}], {offs[i]}, {ptr})",
            f"{I}        m[{bs}] = u",
        ]
    return lines


def guarded_chain(plan: LaunchPlan, I: str, chain: list[str], on_error: list[str]) -> list[str]:  # noqa: E741, N803
    """The memo checks ``chain`` at indent ``I``; where they read tensors, inside a ``try``
    (free in CPython 3.11+ until something raises) whose handler runs ``on_error``."""
    if not plan._versioned:
        return [I + ln for ln in chain]
    return ([f"{I}try:"] + [f"{I}    {ln}" for ln in chain] + [f"{I}except Exception:"]
            + [f"{I}    {ln}" for ln in on_error])


# -- the two functions ---------------------------------------------------------------------------
def launch_lines(g: str, b: str, shmem: str, args: str, hooked: bool) -> list[str]:
    if hooked:  # regenerated when hooks are installed or removed
        return [
            f"    return hooks.dispatch(plan, ({g}), ({b}), {shmem}, st, {args},",
            f"                          lambda: launch_failed(cuLaunchKernel(function, {g}, {b}, {shmem}, "
            f"st._cu, addr, 0)[0], {g}, {b}))",
        ]
    return [
        f"    r = cuLaunchKernel(function, {g}, {b}, {shmem}, st._cu, addr, 0)",
        "    if r[0]:",
        f"        launch_failed(r[0], {g}, {b})",
    ]


def run_source(plan: LaunchPlan, hooked: bool) -> str:
    """``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: packs into this thread's scratch
    slot, which no memo uses."""
    n = len(plan.entry.params)
    I = "        "  # noqa: E741, N806
    names = [f"a{i}" for i in range(n)]
    lines = ["def run(gx, gy, gz, bx, by, bz, shmem, st, args):", "    try:"]
    if n:
        lines.append(f"{I}{', '.join(names)}{',' if n == 1 else ''} = args")
        lines += slots_lines(I)
        lines.append(f"{I}m = ms[{SLOTS + 1}]")
        lines += read_lines(plan, I)
        lines.append(f"{I}addr = m[{plan.memo.addr}]")
    else:
        lines += [f"{I}if args: raise Short()", f"{I}addr = 0"]
    lines += ["    except Exception as exc:", "        diagnose(args, exc)", "        raise"]
    lines += launch_lines("gx, gy, gz", "bx, by, bz", "shmem", "args", hooked)
    return "\n".join(lines) + "\n"


def call_source(plan: LaunchPlan, hooked: bool) -> str:
    """The kernel's call ``(n, a0=MISSING, ..., *_more, stream=None)`` for ``plan``'s device;
    anything off the fast paths (another device, a non-positive or non-int thread count,
    missing or extra arguments) goes to ``slow_call(kernel, n, args, st)``."""
    lo = plan.memo
    D = int(plan.device_id)  # noqa: N806
    bx, by, bz = (int(v) for v in plan.block)
    P = lo.P  # noqa: N806
    names = [f"a{i}" for i in range(P)]
    sig = "".join(f"{a}=MISSING, " for a in names)
    tup = "(" + "".join(f"{a}, " for a in names) + ")"
    lines = [
        f"def __call__(n, {sig}*_more, stream=None):",
        "    if stream is None:",
        "        try:",
        "            st = thread.ready",
        "        except AttributeError:",
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
    if not P:
        lines += [f"    if {guard}:", f"        {to_slow}", "    addr = 0", f"    gx = (n + {bx - 1}) // {bx}"]
        lines += launch_lines("gx, 1, 1", f"{bx}, {by}, {bz}", "0", tup, hooked)
        return "\n".join(lines) + "\n"

    # arguments no memo can hold (a host array first) skip the memos after one failed check
    s0 = next((i for i, reader in enumerate(plan.readers) if reader == "array"), None)
    unstable = "" if s0 is None else f" or type(a{s0}) not in MEMO_TYPES"
    # 1. shared snapshots (filled newest first: an empty first one means none)
    chain: list[str] = []
    for j in range(SLOTS):
        chain.append(f"{'if' if j == 0 else 'elif'} {snapshot_hit(plan, j)}:")
        chain.append("    pass")
        if j == 0:
            chain += [f"elif k[0] is NOMEMO{unstable}:", "    k = None"]
    chain += ["else:", "    k = None"]
    # a remembered tensor whose version can no longer be read (swapped with an inference
    # tensor): drop the memo being checked (``k``, set before anything can raise), read in full
    lines += guarded_chain(plan, "    ", chain, ["unshare(k)", "k = None"])
    lines += ["    if k is not None:"]
    if hooked:
        lines.append(f"        gx = k[{lo.s_gx}]; addr = k[{lo.s_addr}]")
    else:  # the snapshot holds the launch call's whole argument tuple
        lines += [f"        r = launch_prepared(*k[{lo.s_call}])", "        if r[0]:",
                  f"            launch_failed(r[0], k[{lo.s_gx}], 1, 1, {bx}, {by}, {bz})", "        return"]
    lines.append("    else:")
    # 2. this thread's memo slots
    J = "        "  # noqa: N806
    I = J + "        "  # noqa: E741, N806
    lines += [J + ln for ln in slots_lines("")]
    chain = []
    for j in range(SLOTS):
        chain.append(f"{'if' if j == 0 else 'elif'} {slot_hit(plan, j)}:")
        chain.append("    pass")
        if j == 0:  # no slot was ever filled, or arguments that are read every time
            chain += [f"elif not ms[{SLOTS + 2}]{unstable}:", "    m = None"]
    chain += ["else:", "    m = None"]
    lines += guarded_chain(plan, J, chain, [f"m[{lo.stream}] = NOMEMO", "m = None"])
    lines += [
        f"{J}if m is not None:",
        f"{J}    if n is m[{lo.n}]:",  # the same thread count object: the same grid
        f"{J}        gx = m[{lo.gx}]",
        f"{J}    elif type(n) is int and 0 < n <= {MAX_FAST_THREADS}:",
        f"{J}        gx = (n + {bx - 1}) // {bx}",
        f"{J}        m[{lo.n}] = n; m[{lo.gx}] = gx",
        f"{J}    else:",
        f"{J}        {to_slow}",
    ]
    recheck = uniform_recheck_lines(plan, I)
    if recheck:
        lines += [f"{J}    try:"] + recheck
        lines += [f"{J}    except Exception as exc:", f"{J}        diagnose({tup}, exc)", f"{J}        raise"]
    lines += [
        f"{J}    h = m[{lo.hits}] + 1",
        f"{J}    if h >= {PROMOTE_AFTER}:",
        f"{J}        m[{lo.hits}] = 0",
        f"{J}        promote(m, st)",
        f"{J}    else:",
        f"{J}        m[{lo.hits}] = h",
        # 3. the full read into the least recently filled slot
        f"{J}else:",
        f"{J}    if {guard}:",
        f"{J}        {to_slow}",
        f"{J}    gx = (n + {bx - 1}) // {bx}",
        f"{J}    v = ms[{SLOTS}]",
        f"{J}    ms[{SLOTS}] = v + 1 if v < {SLOTS - 1} else 0",
        f"{J}    m = ms[v]",
        f"{J}    try:",
        f"{J}        ep = EPOCH[0]",
        f"{J}        m[{lo.stream}] = NOMEMO",
    ]
    lines += read_lines(plan, I)
    lines += memo_store_lines(plan, I)
    lines += [f"{J}    except Exception as exc:", f"{J}        diagnose({tup}, exc)", f"{J}        raise"]
    lines.append(f"{J}addr = m[{lo.addr}]")
    lines += launch_lines("gx, 1, 1", f"{bx}, {by}, {bz}", "0", tup, hooked)
    return "\n".join(lines) + "\n"
