"""Where an entry point or one of its parameters is written, for error messages only.

Slang's C reflection has no source locations; the facts about entries (names, parameters, types,
layouts) come from reflection, and this module only finds the ``file:line`` to blame, by looking
for the function's definition in the crate's files. It never decides what an entry is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hatch_khal.slang.sources import strip_comments_keep_strings

__all__ = ["Locator"]


@dataclass
class Locator:
    #: (display path, text) of every file of the crate, sources first
    files: list[tuple[str, str]]
    crate: str
    _clean: list[tuple[str, str]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._clean = [(rel, strip_comments_keep_strings(text)) for rel, text in self.files]

    def _definition(self, name: str) -> tuple[str, str, int] | None:
        """(file, clean text, index of the '(') of the definition of function ``name``."""
        pattern = re.compile(rf"\b{re.escape(name)}\s*\(")
        fallback = None
        for rel, text in self._clean:
            for m in pattern.finditer(text):
                before = text[max(0, m.start() - 400): m.start()]
                hit = (rel, text, m.end() - 1)
                if "numthreads" in before or "shader" in before:
                    return hit
                fallback = fallback or hit
        return fallback

    def entry(self, name: str) -> str:
        """``file:line`` of entry ``name`` (the crate's name if it cannot be found)."""
        found = self._definition(name)
        if found is None:
            return f"crate {self.crate!r}"
        rel, text, at = found
        return f"{rel}:{text.count(chr(10), 0, at) + 1}"

    def declaration_head(self, name: str) -> str | None:
        """The text of function ``name``'s declaration before its name, back to the previous ``;``,
        ``{`` or ``}`` (its attributes, modifiers and return type), comments blanked; None if the
        definition is not found."""
        found = self._definition(name)
        if found is None:
            return None
        _, text, at = found
        start = max(text.rfind(ch, 0, at) for ch in ";{}") + 1
        return text[start:at]

    def name(self, identifier: str) -> str:
        """``file:line`` of the first use of ``identifier`` (a global's declaration, say)."""
        pattern = re.compile(rf"\b{re.escape(identifier)}\b")
        for rel, text in self._clean:
            m = pattern.search(text)
            if m:
                return f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
        return f"crate {self.crate!r}"

    def param(self, entry: str, param: str) -> str:
        """``file:line`` of parameter ``param`` of entry ``entry`` (else the entry's place)."""
        found = self._definition(entry)
        if found is None:
            return self.entry(entry)
        rel, text, at = found
        depth, end = 0, len(text)
        for i in range(at, len(text)):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                end = i
                break
        m = re.compile(rf"\b{re.escape(param)}\b").search(text, at, end)
        where = m.start() if m else at
        return f"{rel}:{text.count(chr(10), 0, where) + 1}"
