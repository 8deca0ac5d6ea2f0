"""The C preprocessor, as far as the entry scanner needs it: comments and string literals blanked
with line numbers kept (:func:`strip_comments`), preprocessor lines blanked, and conditional
directives evaluated where they can be (:class:`MacroEnv`, :func:`line_states`).

Why a module of its own: the scanner (:mod:`hatch_khal.entries`) reads markers, this reads
``#if``; both walk the text once (linear time, checked by ``tests/build/test_hardening.py``). A
condition that cannot be decided here (a name the compiler or CUDA headers define) is kept as
undecided, and the compiler decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from khal_runtime import abi

__all__ = ["DEFINE_NAME", "Cond", "MacroEnv", "blank_preprocessor", "line_states", "strip_comments"]

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # matched whole (fullmatch)


@dataclass(frozen=True)
class Cond:
    """A conditional directive the scanner could not decide (for messages)."""

    where: str  # file:line
    text: str  # "#if FOO > 2"

    def __str__(self) -> str:
        return f"{self.text!r} at {self.where}"



# ---------------------------------------------------------------------------------------------
# text preparation
# ---------------------------------------------------------------------------------------------
_LEXEME = re.compile(r"""//[^\n]*|/\*[\s\S]*?(?:\*/|\Z)|"(?:\\[\s\S]|[^"\\\n])*"?|'(?:\\[\s\S]|[^'\\\n])*'?""")
_NOT_NEWLINE = re.compile(r"[^\n]")


def _blank(segment: str) -> str:
    return _NOT_NEWLINE.sub(" ", segment)


def strip_comments(text: str, *, keep_strings: bool = False) -> str:
    """Blank comments (and, unless ``keep_strings``, the insides of string and char literals);
    keep every newline, so line numbers hold. One regular-expression pass: linear time."""

    def repl(m: re.Match[str]) -> str:
        s = m.group(0)
        if s[0] == "/":
            return _blank(s)
        if keep_strings:
            return s
        if len(s) >= 2 and s[-1] == s[0]:
            return s[0] + _blank(s[1:-1]) + s[0]
        return s[0] + _blank(s[1:])

    return _LEXEME.sub(repl, text)


def blank_preprocessor(text: str) -> str:
    lines = text.split("\n")
    out = []
    cont = False
    for line in lines:
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)



# the preprocessor's conditionals, as far as they can be decided
# ---------------------------------------------------------------------------------------------
#: names the compiler or the CUDA / CCCL headers define, which the scanner cannot know
_FOREIGN_PREFIXES = ("CUDA", "CUDART", "CUB_", "THRUST_", "NV_", "CCCL_", "LIBCUDACXX", "CUFFT", "CUBLAS")
_BUILTIN_MACROS: dict[str, int | None] = {"KHAL_SCANNED": 1, "KHAL_ABI_VERSION": abi.ABI_VERSION,
                                          "__CUDACC__": 1, "__CUDACC_RTC__": 1}


@dataclass
class MacroEnv:
    """What the scanner knows of macros: ``known`` (defined, with their value, None when it is
    not a number), ``maybe`` (names some file of the crate defines or undefines: unknown), and
    whether other names are known to be undefined (``closed``: a crate's own names; never those
    of the compiler and the CUDA headers)."""

    known: dict[str, int | None] = field(default_factory=dict)
    maybe: frozenset[str] = frozenset()
    closed: bool = False
    _undef: set[str] = field(default_factory=set)
    _unknown: set[str] = field(default_factory=set)

    @classmethod
    def for_crate(cls, defines: Mapping[str, str], options: Iterable[str]) -> MacroEnv:
        """The crate's ``defines`` and ``-D`` / ``-U`` options and the builtins; other names of
        the crate's own are undefined unless a file defines them (:meth:`for_file`)."""
        known: dict[str, int | None] = dict(_BUILTIN_MACROS)
        raw = dict(defines)
        opts = list(options)
        undef: set[str] = set()
        i = 0
        while i < len(opts):
            o = opts[i]
            nxt = opts[i + 1] if i + 1 < len(opts) else ""
            for flag, into in (("-D", raw), ("--define-macro", raw), ("-U", None), ("--undefine-macro", None)):
                if o == flag and nxt:
                    val, i = nxt, i + 1
                elif o.startswith(flag + "=") and flag.startswith("--"):
                    val = o[len(flag) + 1:]
                elif o.startswith(flag) and not flag.startswith("--") and len(o) > len(flag):
                    val = o[len(flag):]
                else:
                    continue
                name, _, v = val.partition("=")
                if into is None:
                    undef.add(name)
                    raw.pop(name, None)
                else:
                    raw[name] = v if "=" in val else ""
                break
            i += 1
        env = cls(known, closed=True)
        for name, v in raw.items():
            known[name] = 1 if v == "" else env.evaluate(v)
        for name in undef:
            known.pop(name, None)
        return env

    def for_file(self, others: Iterable[str]) -> MacroEnv:
        """A copy for one file, ``others`` being the names the crate's *other* files define or
        undefine (unknown here: the scanner does not follow the include order; the file's own
        ``#define``\\ s are followed line by line)."""
        env = self.fork()
        env.maybe = frozenset(others)
        return env

    def fork(self) -> MacroEnv:
        """A copy for one file (its own ``#define``\\ s update it as it is read)."""
        return MacroEnv(dict(self.known), self.maybe, self.closed, set(self._undef), set(self._unknown))

    def lookup(self, name: str) -> tuple[bool | None, int | None]:
        """(defined?, value): (True, v) / (False, 0) / (None, None) when unknown."""
        if name in self._unknown:
            return None, None
        if name in self.known:
            return True, self.known[name]
        if name in self._undef:
            return False, 0
        if (name in self.maybe or not self.closed or name.startswith("__") or re.match(r"_[A-Z]", name)
                or name.startswith(_FOREIGN_PREFIXES)):
            return None, None
        return False, 0

    def define(self, name: str, value: str, state: bool | None) -> None:
        if state is False:
            return
        if state is None:
            self._unknown.add(name)
            return
        self._unknown.discard(name)
        self._undef.discard(name)
        self.known[name] = self.evaluate(value) if value.strip() else None

    def undefine(self, name: str, state: bool | None) -> None:
        if state is False:
            return
        if state is None:
            self._unknown.add(name)
            return
        self._unknown.discard(name)
        self.known.pop(name, None)
        self._undef.add(name)

    def evaluate(self, expr: str) -> int | None:
        """The value of a ``#if`` expression; None when it depends on something unknown."""
        try:
            return _Eval(expr, self).run()
        except (_Undecided, ValueError, OverflowError, RecursionError):  # the compiler decides (and reports)
            return None


DEFINE_NAME = re.compile(r"^[ \t]*#[ \t]*(define|undef)[ \t]+([A-Za-z_]\w*)", re.M)
_PP_TOKEN = re.compile(r"\s*(?:(?P<num>0[xX][0-9a-fA-F]+|\d+)(?:[uUlL]*)(?![\w.])|(?P<id>[A-Za-z_]\w*)"
                       r"|(?P<op>\|\||&&|==|!=|<=|>=|<<|>>|[-+*/%<>!~&^|?:(),]))")


class _Undecided(Exception):
    pass


class _Eval:
    """Recursive descent over a ``#if`` expression; values are ints or None (unknown)."""

    def __init__(self, expr: str, env: MacroEnv) -> None:
        self.toks: list[tuple[str, str]] = []
        pos = 0
        expr = expr.strip()
        while pos < len(expr):
            m = _PP_TOKEN.match(expr, pos)
            if m is None or m.end() == pos:
                if expr[pos:].strip():
                    raise _Undecided  # char literals, strings, anything odd: the compiler decides
                break
            kind = m.lastgroup or ""
            self.toks.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0
        self.env = env

    def run(self) -> int | None:
        if not self.toks:
            raise _Undecided
        v = self.cond()
        if self.i != len(self.toks):
            raise _Undecided
        return v

    def peek(self) -> str:
        return self.toks[self.i][1] if self.i < len(self.toks) else ""

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks) or (want is not None and self.toks[self.i][1] != want):
            raise _Undecided
        self.i += 1
        return self.toks[self.i - 1]

    def cond(self) -> int | None:
        c = self.binary(0)
        if self.peek() != "?":
            return c
        self.take("?")
        a = self.cond()
        self.take(":")
        b = self.cond()
        if c is None:
            return a if a == b and a is not None else None
        return a if c else b

    _LEVELS: tuple[tuple[str, ...], ...] = (("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="),
                                            ("<", ">", "<=", ">="), ("<<", ">>"), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> int | None:
        if level == len(self._LEVELS):
            return self.unary()
        v = self.binary(level + 1)
        while self.peek() in self._LEVELS[level] and self.toks[self.i][0] == "op":
            op = self.take()[1]
            w = self.binary(level + 1)
            v = self.apply(op, v, w)
        return v

    @staticmethod
    def apply(op: str, a: int | None, b: int | None) -> int | None:
        if op == "||":
            return 1 if a or b else (0 if a == 0 and b == 0 else None)
        if op == "&&":
            return 0 if a == 0 or b == 0 else (1 if a is not None and b is not None else None)
        if a is None or b is None:
            return None
        if op in ("/", "%"):
            if b == 0:
                return None
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            return q if op == "/" else a - q * b
        if op in ("<<", ">>") and (b < 0 or b > 63):
            return None
        fns: dict[str, Callable[[int, int], int]] = {
            "|": lambda x, y: x | y, "^": lambda x, y: x ^ y, "&": lambda x, y: x & y,
            "==": lambda x, y: int(x == y), "!=": lambda x, y: int(x != y), "<": lambda x, y: int(x < y),
            ">": lambda x, y: int(x > y), "<=": lambda x, y: int(x <= y), ">=": lambda x, y: int(x >= y),
            "<<": lambda x, y: x << y, ">>": lambda x, y: x >> y, "+": lambda x, y: x + y,
            "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        }
        return fns[op](a, b)

    def unary(self) -> int | None:
        t = self.peek()
        if t in ("!", "~", "-", "+") and self.toks[self.i][0] == "op":
            self.take()
            v = self.unary()
            if v is None:
                return None
            return {"!": int(not v), "~": ~v, "-": -v, "+": v}[t]
        return self.primary()

    def primary(self) -> int | None:
        kind, text = self.take()
        if kind == "num":
            return int(text.rstrip("uUlL"), 0) if not (len(text) > 1 and text[0] == "0" and text[1] not in "xX") \
                else int(text.rstrip("uUlL"), 8)
        if text == "(":
            v = self.cond()
            self.take(")")
            return v
        if kind != "id":
            raise _Undecided
        if text == "defined":
            paren = self.peek() == "("
            if paren:
                self.take("(")
            k, name = self.take()
            if k != "id":
                raise _Undecided
            if paren:
                self.take(")")
            d, _ = self.env.lookup(name)
            return None if d is None else int(d)
        if self.peek() == "(":  # a function-like macro (__has_include, NV_IF_TARGET, ...)
            depth = 0
            while self.i < len(self.toks):
                t = self.take()[1]
                depth += t == "("
                depth -= t == ")"
                if depth == 0:
                    break
            return None
        d, v = self.env.lookup(text)
        if d is None:
            return None
        return v if d else 0


_DIRECTIVE = re.compile(r"^\s*#\s*(\w*)\s*(.*)$", re.S)


def line_states(stripped: str, display: str, env: MacroEnv) -> list[tuple[bool | None, tuple[Cond, ...]]]:
    """Per line (0-based) of comment-stripped text: whether the compiler sees it (True, False,
    None: undecided) and the undecided conditions around it. Updates ``env`` with the file's
    own ``#define`` / ``#undef`` lines."""
    lines = stripped.split("\n")
    out: list[tuple[bool | None, tuple[Cond, ...]]] = []
    # frames: [taken, current, cond]
    stack: list[list[object]] = []
    broken = False

    def state() -> tuple[bool | None, tuple[Cond, ...]]:
        if broken:
            return None, (Cond(f"{display}", "unbalanced #if/#endif"),)
        s: bool | None = True
        conds: list[Cond] = []
        for f in stack:
            cur = f[1]
            if cur is False:
                return False, ()
            if cur is None:
                s = None
                conds.append(f[2])  # type: ignore[arg-type]
        return s, tuple(conds)

    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.lstrip().startswith("#"):
            out.append(state())
            i += 1
            continue
        start = i
        joined = line
        while joined.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            joined = joined.rstrip()[:-1] + " " + lines[i]
        m = _DIRECTIVE.match(joined)
        name, rest = (m.group(1), m.group(2).strip()) if m else ("", "")
        before = state()
        cond = Cond(f"{display}:{start + 1}", f"#{name} {rest}".strip())
        if name in ("if", "ifdef", "ifndef"):
            if name == "if":
                v = env.evaluate(rest)
                c: bool | None = None if v is None else v != 0
            else:
                word = rest.split()[0] if rest.split() else ""
                d, _ = env.lookup(word)
                c = None if d is None else (d if name == "ifdef" else not d)
            stack.append([c, c, cond])
        elif name in ("elif", "elifdef", "elifndef", "else"):
            if not stack:
                broken = True
            else:
                f = stack[-1]
                if name == "else":
                    c = True
                elif name == "elif":
                    v = env.evaluate(rest)
                    c = None if v is None else v != 0
                else:
                    word = rest.split()[0] if rest.split() else ""
                    d, _ = env.lookup(word)
                    c = None if d is None else (d if name == "elifdef" else not d)
                taken = f[0]
                if taken is True:
                    cur: bool | None = False
                elif taken is False:
                    cur = c
                else:
                    cur = False if c is False else None
                f[0] = True if (taken is True or c is True) else (None if (taken is None or c is None) else False)
                f[1] = cur
                f[2] = cond
        elif name == "endif":
            if stack:
                stack.pop()
            else:
                broken = True
        elif name in ("define", "undef") and not broken:
            parts = rest.split(None, 1)
            if parts and _IDENT_RE.fullmatch(re.split(r"[(\s]", parts[0])[0]):
                macro = re.split(r"[(\s]", parts[0])[0]
                outer = state()[0]
                if name == "undef":
                    env.undefine(macro, outer)
                elif "(" in parts[0]:  # function-like: its value is never a number
                    env.define(macro, "", outer)
                else:
                    env.define(macro, parts[1] if len(parts) > 1 else "", outer)
        for _ in range(start, i + 1):
            out.append(before)
        i += 1
    return out
