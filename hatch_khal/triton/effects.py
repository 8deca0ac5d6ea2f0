"""Which pointer arguments a compiled Triton kernel may write, read from Triton's own IR.

:func:`written_pointers` takes the kernel's TTIR (``compiled.asm["ttir"]``, the MLIR text Triton
lowers to the binary) and answers the positions of the entry function's parameters that MAY be
written, or None when the text is not what the analysis expects (then every pointer counts as
written: a refusal to prove is never an error).

How: every value of the entry ``tt.func`` carries a *taint*, the set of parameters its address
may derive from (``ALL``: any address at all). A parameter taints itself; taints flow over the
SSA def-use of the text to a fixpoint:

* pointer arithmetic and shape ops (:data:`PROPAGATE`: ``tt.splat``, ``tt.addptr``,
  ``tt.make_tensor_descriptor``, ``arith.select`` ...) give their results the union of their
  operands' taints; they neither read nor write memory;
* loads (:data:`READS`) write nothing; their result is tainted only when it is a pointer (a
  pointer loaded from memory may point anywhere: ``ALL``, with the address's taint);
* ``arith.*`` (but ``select``), ``math.*`` and the numeric ops of :data:`NUMERIC` cannot take a
  pointer operand (MLIR's verifiers refuse one), so a taint on their operands carries no address;
  their results are untainted;
* ``scf.for`` / ``scf.if`` / ``scf.while`` link each result, iter_arg and block argument to the
  operands that feed it at its position (inits, ``scf.yield``, ``scf.condition``);
* ``tt.reduce`` / ``tt.scan`` (:data:`COMBINE`: ``tl.sum``, ``tl.max``, ``tl.cumsum`` ...) write no
  memory: their results and their combining region's block arguments take the union of their
  operands' and the region's ``*.return`` operands' taints (the ops inside the region are read as
  any other op: a store there still writes);
* ``tt.int_to_ptr`` (an address made from an integer) is ``ALL``;
* EVERY other op (``tt.store``, atomics, ``tt.descriptor_store``, ``tt.call``, inline asm, extern
  functions, ``tt.ptr_to_int``, ``tt.print``, any op this module does not know) makes every taint
  of every operand written, and its results are ``ALL`` when its printed types mention a pointer
  or descriptor; an unknown op with regions also links its results and block arguments to every
  operand of it and of its regions' terminators.

A parameter is read-only when no written taint is it or ``ALL``.

What is proven, from the compiler's IR: no store, atomic or other memory-writing op, no call,
inline asm or extern function, and no conversion of the address to an integer or into stored
data, receives a value whose address derives from the parameter.

What is assumed:

1. the TTIR is what the binary was compiled from (it is Triton's own pipeline stage; the later
   stages only lower it) and its ops mean what Triton documents (``tt.load`` does not write ...);
2. an access through a pointer derived from parameter A (``tt.addptr`` by any offset) stays in
   the memory passed as A (the same assumption PyTorch makes of any operator's aliasing);
3. MLIR's printer prints a value's name the same at its definition and its uses, and scopes names
   by region: a value defined in a region is visible in it and in the regions nested in it, and
   sibling regions (two loops' bodies, a loop's body and a reduction's combiner) reuse names for
   values of their own; a use resolves to the innermost enclosing region defining its name (a
   name none defines, as an unknown region op's own arguments, may be any address: ``ALL``);
4. an op's printed types mention a pointer (``ptr``) or descriptor (``tensordesc``) when it
   returns one (MLIR's custom forms print every type they cannot infer from the operands).
"""

from __future__ import annotations

import re
from typing import Callable, Optional

__all__ = ["ALL", "COMBINE", "written_pointers"]

#: the taint of an address that may point anywhere
ALL = -1

#: ops that compute an address from their operands and touch no memory: results take the union
PROPAGATE = frozenset({
    "tt.splat", "tt.broadcast", "tt.addptr", "tt.expand_dims", "tt.reshape", "tt.trans", "tt.advance",
    "tt.make_tensor_ptr", "tt.make_tensor_descriptor", "arith.select", "tt.join", "tt.split", "tt.cat",
    "tt.unsplat",
})
#: ops that read memory and write none
READS = frozenset({"tt.load", "tt.descriptor_load", "tt.descriptor_gather"})
#: ops whose operands cannot be pointers (numeric only): no address flows through them
NUMERIC = frozenset({
    "tt.dot", "tt.dot_scaled", "tt.get_program_id", "tt.get_num_programs", "tt.make_range", "tt.fp_to_fp",
    "tt.precise_sqrt", "tt.precise_divf", "tt.mulhiui", "tt.clampf",
})
#: ops whose regions only combine values (a reduction's or scan's combiner): they touch no memory
COMBINE = frozenset({"tt.reduce", "tt.scan"})
#: terminators of the scf regions the analysis links position by position
_LINKED = frozenset({"scf.for", "scf.if", "scf.while"})

_NAME = r"%[A-Za-z0-9_$.\-]+"
_USE = re.compile(rf"({_NAME})(?:#(\d+))?")
_RESULTS = re.compile(rf"^((?:{_NAME}(?::\d+)?)(?:\s*,\s*{_NAME}(?::\d+)?)*)\s*=\s*")
_OP = re.compile(r'^("?[A-Za-z_][\w.$]*"?)')
_STR = re.compile(r'"(?:[^"\\]|\\.)*"')
#: a string that is an op's name (the generic form ``"tt.reduce"(...)``), kept as it is
_OP_NAME = re.compile(r'^"[a-z_][\w]*\.[\w.]+"$')


_Of = Callable[[list[str]], set[int]]
_Add = Callable[[str, set[int]], None]


class _Unexpected(Exception):
    """The text is not the TTIR this module reads."""


def _strip(line: str) -> str:
    """``line`` without its string literals' contents and its ``loc(...)`` trailers."""
    line = _STR.sub(lambda m: m.group(0) if _OP_NAME.match(m.group(0)) else '""', line)
    out = []
    i = 0
    while True:
        j = line.find("loc(", i)
        if j < 0:
            out.append(line[i:])
            break
        out.append(line[i:j])
        depth, k = 0, j + 3
        while k < len(line):
            if line[k] == "(":
                depth += 1
            elif line[k] == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1
    return "".join(out).strip()


def _key(name: str, index: Optional[str]) -> str:
    return f"{name}#{index or 0}"


def _uses(text: str) -> list[str]:
    return [_key(m.group(1), m.group(2)) for m in _USE.finditer(text)]


def _defs(results: str) -> list[str]:
    out: list[str] = []
    for part in results.split(","):
        part = part.strip()
        if ":" in part:
            name, n = part.split(":")
            out += [_key(name, str(i)) for i in range(int(n))]
        else:
            out.append(_key(part, None))
    return out


class _Op:
    def __init__(self, name: str, results: list[str], rest: str, line: str, scope: int) -> None:
        self.name = name
        self.results = results
        self.rest = rest  # the text after the op's name
        self.line = line
        #: the region the op is in (0: the function's body); its names resolve there (see _Scopes)
        self.scope = scope
        self.operands = _uses(rest)
        #: region ops: their regions' scopes, block arguments (per region) and terminators
        self.scopes: list[int] = []
        self.regions: list[list[str]] = []
        self.terminators: list[tuple[int, "_Op"]] = []
        #: names the op's own text defines inside its first region (scf.for's induction variable and
        #: iter_args, scf.while's arguments): not operands of the op; and the values it gives them
        self.header: list[str] = []
        self.inits: list[str] = []


#: the taint of a use whose name no enclosing region defines (a value this module does not see
#: defined, such as an unknown region op's own arguments): it may be any address
_UNKNOWN = frozenset({ALL})


class _Scopes:
    """MLIR's scoping of SSA names: a value defined in a region is visible in that region and the
    regions nested in it; sibling regions (two ``scf.for`` bodies, a loop body and a ``tt.reduce``
    combiner) print their values under the same names (``%3``, ``%start``), which are different
    values. Each region is a scope; a name resolves to the innermost enclosing scope defining it
    (a name defined nowhere visible: ``?/name``, which may be any address)."""

    def __init__(self) -> None:
        self.parent: list[Optional[int]] = [None]  # scope 0: the function's body (its parameters)
        self.defs: list[set[str]] = [set()]

    def new(self, parent: int) -> int:
        self.parent.append(parent)
        self.defs.append(set())
        return len(self.parent) - 1

    def define(self, scope: int, key: str) -> str:
        self.defs[scope].add(key)
        return f"{scope}/{key}"

    def resolve(self, scope: int, key: str) -> str:
        s: Optional[int] = scope
        while s is not None:
            if key in self.defs[s]:
                return f"{s}/{key}"
            s = self.parent[s]
        return f"?/{key}"


def _entry_lines(ttir: str, name: Optional[str]) -> tuple[list[str], list[str]]:
    """The entry function's parameters (SSA names, in order) and its body's lines."""
    lines = ttir.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if not s.startswith("tt.func public @"):
            continue
        if name is not None and not s.startswith(f"tt.func public @{name}("):
            continue
        header = _strip(s)
        close = header.rfind(")")
        open_ = header.find("(")
        if open_ < 0 or close < open_ or not header.endswith("{"):
            raise _Unexpected(header)
        params = re.findall(rf"({_NAME})\s*:", header[open_ + 1:close])
        body: list[str] = []
        depth = 1
        for line2 in lines[i + 1:]:
            t = _strip(line2)
            depth += t.count("{") - t.count("}")
            if depth <= 0:
                return [_key(p, None) for p in params], body
            body.append(t)
        raise _Unexpected("the entry function does not end")
    raise _Unexpected("no public entry tt.func")


def _header(name: str, rest: str) -> tuple[list[str], list[str]]:
    """The names an op's own text defines in its first region, and the values it initialises the
    carried ones with (its operands): ``scf.for %iv = ... iter_args(%a = %init, ...)`` (the
    induction variable first, with no init) and ``scf.while (%a = %init, ...)``."""
    if name == "scf.for":
        iv = re.match(rf"\s*({_NAME})\s*=", rest)
        pairs = re.findall(rf"({_NAME})\s*=\s*({_NAME}(?:#\d+)?)", rest.split("iter_args(", 1)[1]) \
            if "iter_args(" in rest else []
        if iv is None:
            raise _Unexpected(rest)
        return [_key(iv.group(1), None)] + [_key(a, None) for a, _ in pairs], [_uses(b)[0] for _, b in pairs]
    if name == "scf.while":
        pairs = re.findall(rf"({_NAME})\s*=\s*({_NAME}(?:#\d+)?)", rest.split(":", 1)[0])
        return [_key(a, None) for a, _ in pairs], [_uses(b)[0] for _, b in pairs]
    return [], []


def _parse(body: list[str], params: list[str]) -> tuple[list[_Op], list[str]]:
    """The body's ops (those of nested regions too, each terminator attached to its region op),
    every name resolved to its scope; and the parameters' resolved names."""
    scopes = _Scopes()
    ops: list[_Op] = []
    every: list[_Op] = []
    stack: list[_Op] = []

    def here() -> int:
        return stack[-1].scopes[-1] if stack else 0

    def open_region(op: _Op) -> None:
        op.scopes.append(scopes.new(op.scope))
        op.regions.append([])

    for t in body:
        if not t:
            continue
        delta = t.count("{") - t.count("}")
        if t.startswith("}"):
            # `}`, `} else {`, `} do {`, `})`, `}) : ...`
            if not stack:
                raise _Unexpected(t)
            if delta == 0 and t.endswith("{"):
                open_region(stack[-1])
                continue
            if delta != -1:
                raise _Unexpected(t)
            stack.pop()
            continue
        if t.startswith("^"):
            if not stack or not stack[-1].regions:
                raise _Unexpected(t)
            stack[-1].regions[-1] += [scopes.define(here(), _key(n, None)) for n in re.findall(rf"({_NAME})\s*:", t)]
            continue
        m = _RESULTS.match(t)
        t2 = t[m.end():] if m else t
        mo = _OP.match(t2)
        if mo is None:
            raise _Unexpected(t)
        name = mo.group(1).strip('"')
        scope = here()
        op = _Op(name, [scopes.define(scope, k) for k in (_defs(m.group(1)) if m else [])], t2[mo.end():], t, scope)
        every.append(op)
        if stack and (name in ("scf.yield", "scf.condition")
                      or (stack[-1].name not in _LINKED and name.endswith((".return", ".yield")))):
            stack[-1].terminators.append((len(stack[-1].regions) - 1, op))
        else:
            ops.append(op)
        if delta == 1:
            open_region(op)
            defs, inits = _header(name, op.rest)
            op.header = [scopes.define(op.scopes[0], k) for k in defs]
            op.inits = [scopes.resolve(op.scope, k) for k in inits]
            stack.append(op)
        elif delta != 0:
            raise _Unexpected(t)
    if stack:
        raise _Unexpected("an unclosed region")
    resolved = [scopes.define(0, p) for p in params]
    for op in every:  # uses resolve once every definition is known (a block's arguments come first)
        header = {h.split("/", 1)[1] for h in op.header}
        op.operands = [scopes.resolve(op.scope, k) for k in op.operands if k not in header]
    return ops, resolved


def written_pointers(ttir: str, name: Optional[str] = None, arity: Optional[int] = None) -> Optional[set[int]]:
    """Positions (among the entry function's parameters) that the kernel may write, or None when
    the text cannot be read as expected (callers then count every pointer as written). ``name``:
    the kernel's function name (``metadata.name``), None for the first public ``tt.func``;
    ``arity``: the number of parameters the caller expects (another number: None)."""
    try:
        raw, body = _entry_lines(ttir, name)
        ops, params = _parse(body, raw)
    except (_Unexpected, ValueError, IndexError):
        return None
    if arity is not None and len(params) != arity:
        return None
    taint: dict[str, set[int]] = {p: {i} for i, p in enumerate(params)}
    written: set[int] = set()

    def of(keys: list[str]) -> set[int]:
        out: set[int] = set()
        for k in keys:
            out |= taint.get(k, _UNKNOWN if k.startswith("?/") else set())
        return out

    changed = True

    def add(key: str, t: set[int]) -> None:
        nonlocal changed
        if not t:
            return
        cur = taint.setdefault(key, set())
        if not t <= cur:
            cur |= t
            changed = True

    def write(t: set[int]) -> None:
        nonlocal changed
        if not t <= written:
            written.update(t)
            changed = True

    def pointer_types(text: str) -> bool:
        return "ptr" in text or "tensordesc" in text

    for _ in range(10_000):
        if not changed:
            break
        changed = False
        for op in ops:
            n = op.name
            if n in PROPAGATE:
                t = of(op.operands)
                for r in op.results:
                    add(r, t)
            elif n in READS:
                if n == "tt.load" and op.rest.count("ptr<") >= 2:  # a loaded pointer: it may point anywhere
                    t = of(op.operands) | {ALL}
                    for r in op.results:
                        add(r, t)
            elif n.startswith(("arith.", "math.")) or n in NUMERIC:
                pass
            elif n == "tt.int_to_ptr":
                for r in op.results:
                    add(r, {ALL})
            elif n == "tt.return" and not op.operands:
                pass
            elif n == "scf.for":
                _link_for(op, of, add)
            elif n == "scf.if":
                _link_if(op, of, add)
            elif n == "scf.while":
                _link_while(op, of, add)
            elif n in COMBINE:
                t = of(op.operands) | of([u for _, term in op.terminators for u in term.operands])
                for r in op.results + [a for region in op.regions for a in region]:
                    add(r, t)
            else:
                # anything else may write through, or let escape, every address it is given
                inner = [u for _, term in op.terminators for u in term.operands]
                t = of(op.operands) | of(inner)
                write(t)
                if op.regions:
                    for r in op.results + [a for region in op.regions for a in region]:
                        add(r, t)
                if pointer_types(op.rest.rsplit("->", 1)[-1]):
                    for r in op.results:
                        add(r, {ALL})
    else:  # pragma: no cover - a fixpoint over finite sets always ends
        return None
    if ALL in written:
        return set(range(len(params)))
    return written


def _link_for(op: _Op, of: "_Of", add: "_Add") -> None:
    iters = op.header[1:]  # after the induction variable
    yields = [t for _, t in op.terminators]
    if len(iters) != len(op.results) or len(op.inits) != len(iters) or any(
            len(y.operands) != len(iters) for y in yields):
        raise _Unexpected(op.line)
    for i, it in enumerate(iters):
        t = of([op.inits[i]]) | of([y.operands[i] for y in yields])
        add(it, t)
        add(op.results[i], t)


def _link_if(op: _Op, of: "_Of", add: "_Add") -> None:
    for _, y in op.terminators:
        if len(y.operands) != len(op.results):
            raise _Unexpected(op.line)
        for r, u in zip(op.results, y.operands):
            add(r, of([u]))


def _link_while(op: _Op, of: "_Of", add: "_Add") -> None:
    before, inits = op.header, op.inits
    after = op.regions[1] if len(op.regions) > 1 else []
    for region, term in op.terminators:
        if term.name == "scf.condition":
            passed = term.operands[1:]
            if len(passed) != len(op.results) or len(passed) != len(after):
                raise _Unexpected(op.line)
            for i, u in enumerate(passed):
                add(op.results[i], of([u]))
                add(after[i], of([u]))
        else:
            if len(term.operands) != len(before):
                raise _Unexpected(op.line)
            for i, u in enumerate(term.operands):
                add(before[i], of([u]))
    for b, init in zip(before, inits):
        add(b, of([init]))

