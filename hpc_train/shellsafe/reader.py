"""The characters of a script and the words they make, read as bash reads them: quotes, escapes and the
expansions inside words (``$name``, ``${...}``, ``$( )``, ``$(( ))``, backquotes, ``$'...'``), each character of a
job value checked (:func:`.rules.check_char`) in the context it is read in. :class:`~.lexer.Lexer` adds the
commands around the words.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from . import rules
from .marks import Origin, Region
from .rules import Unsafe
from .words import EXPANSION, IDENT_START, TEMPLATE_QUOTED, Word

META = frozenset(" \t\n;&|()<>")
_SPECIAL_PARAMS = frozenset("@*#?$!-0123456789")


class Unreadable(Exception):
    """The script is not shell this reader can follow (a quote or ``$(`` left open): where values land cannot
    be told."""


class Reader:
    """Characters and words of one script; a job value's character that breaks its context raises
    :class:`~.rules.Unsafe`."""

    def __init__(self, text: str, regions: Sequence[Region], depth: int = 0) -> None:
        self.text, self.n, self.i, self.depth = text, len(text), 0, depth
        self.regions = list(regions)
        self._starts = [r.start for r in self.regions]
        self.stack = ["code"]
        self.current: Origin | None = None
        self.opened: dict[Origin, tuple[str, ...]] = {}

    # -- characters --------------------------------------------------------------------------------
    def origin(self, pos: int) -> Origin | None:
        k = bisect.bisect_right(self._starts, pos) - 1
        return self.regions[k].origin if k >= 0 and self.regions[k].end > pos else None

    def tainted_between(self, start: int, end: int) -> Origin | None:
        k = max(0, bisect.bisect_right(self._starts, start) - 1)
        for region in self.regions[k:]:
            if region.start >= end:
                break
            if region.end > start:
                return region.origin
        return None

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.text[j] if j < self.n else ""

    def at(self, text: str) -> bool:
        return self.text.startswith(text, self.i)

    def take(self, context: str | None = None) -> tuple[str, Origin | None]:
        if self.i >= self.n:
            raise Unreadable("the script ends inside a quote or an expansion")
        ch, origin = self.text[self.i], self.origin(self.i)
        self.i += 1
        if origin != self.current:
            self.leave()
            if origin is not None:
                self.opened.setdefault(origin, tuple(self.stack))
            self.current = origin
        if origin is not None:
            rules.check_char(ch, origin, context or self.stack[-1])
        return ch, origin

    def leave(self) -> None:
        """The value being read ends here: it must end in the quoting it started in."""
        if self.current is not None and self.opened.get(self.current) != tuple(self.stack):
            raise rules.unbalanced(self.current)
        self.current = None

    def skip_blanks(self) -> None:
        while self.peek() in (" ", "\t") and self.peek():
            self.take()

    # -- words -------------------------------------------------------------------------------------
    def word(self) -> Word:
        word = Word()
        braces = 0
        tilde = self.peek() == "~" and self.origin(self.i) is None
        while self.i < self.n and self.peek() not in META:
            c, origin = self.peek(), self.origin(self.i)
            if origin is not None and (braces or tilde):
                raise Unsafe(origin, "inside a {...} brace expansion" if braces else "in a ~user tilde prefix")
            if c == "'":
                self.single_quoted(word)
            elif c == '"':
                self.double_quoted(word)
            elif c == "\\":
                self.take()
                if self.peek() == "\n":
                    self.take()
                elif self.i < self.n:
                    word.add(*self.take(), True)
            elif c == "$":
                self.dollar(word, quoted=False)
            elif c == "`":
                self.backquoted(word)
            else:
                self.take()
                braces += {"{": 1, "}": -1 if braces else 0}.get(c, 0) if origin is None else 0
                tilde = tilde and c != "/"
                word.add(c, origin, False)
        return word

    def single_quoted(self, word: Word) -> None:
        quoted = TEMPLATE_QUOTED if self.take()[1] is None else True
        self.stack.append("sq")
        while self.peek() != "'":
            word.add(*self.take(), quoted)
        self.take()
        self.stack.pop()

    def double_quoted(self, word: Word) -> None:
        quoted = TEMPLATE_QUOTED if self.take()[1] is None else True
        self.stack.append("dq")
        while True:
            c = self.peek()
            if c == '"':
                self.take()
                break
            if c == "\\":
                self.take()
                if self.peek() == "\n":
                    self.take()
                    continue
                if self.peek() not in ('$', '`', '"', "\\"):
                    word.add("\\", None, True)
                word.add(*self.take(), True)
            elif c == "$":
                self.dollar(word, quoted=True)
            elif c == "`":
                self.backquoted(word)
            else:
                word.add(*self.take(), quoted)
        self.stack.pop()

    def dollar(self, word: Word, *, quoted: bool) -> None:
        start = self.i
        self.take()
        c = self.peek()
        printed: Origin | None = None
        if self.at("(("):
            self.take(), self.take()
            self.arithmetic("))")
        elif c == "(":
            self.take()
            self.nested(")")
            printed = self.tainted_between(start, self.i)  # what $( ) prints may be a job value: code to eval
        elif c == "{":
            self.take()
            self.parameter()
        elif c == "[":
            self.take()
            self.arithmetic("]")
        elif c == "'" and not quoted:
            self.ansi_c(word)
            return
        elif c == '"' and not quoted:
            self.double_quoted(word)
            return
        elif c and c in _SPECIAL_PARAMS:
            self.take("param_name")
        elif c and c in IDENT_START:
            while self.peek() and (self.peek() in IDENT_START or self.peek().isdigit()):
                self.take("param_name")
        else:
            word.add("$", None, quoted)
            return
        word.add(EXPANSION, printed, quoted)
        word.dynamic = True

    def arithmetic(self, end: str) -> None:
        self.stack.append("arith")
        depth = 0
        while not (depth == 0 and self.at(end)):
            c = self.peek()
            if c == "$":
                self.dollar(Word(), quoted=True)
            elif c == "`":
                self.backquoted(Word())
            else:
                self.take()
                depth += {"(": 1, ")": -1}.get(c, 0)
        for _ in end:
            self.take()
        self.stack.pop()

    def parameter(self) -> None:
        """``${...}``: its name (and index, arithmetic), then the word of its operator (a substring's offset and
        length: arithmetic)."""
        self.stack.append("param_name")
        if self.peek() in ("#", "!") and self.peek(1) != "}":
            self.take()
        if self.peek() in _SPECIAL_PARAMS:
            self.take()
        while self.peek() and (self.peek() in IDENT_START or self.peek().isdigit()):
            self.take()
        if self.peek() == "[":
            self.take()
            self.arithmetic("]")
        if self.peek() == ":" and self.peek(1) not in ("-", "=", "?", "+"):
            self.take()  # ${X:offset:length}: both are arithmetic, evaluated as code
            self.arithmetic("}")
            self.stack.pop()
            return
        self.stack[-1] = "param_word"
        while self.peek() != "}":
            c = self.peek()
            if c == "\\":
                self.take(), self.take()
            elif c == "$":
                self.dollar(Word(), quoted=True)
            elif c == "`":
                self.backquoted(Word())
            else:
                self.take()
        self.take()
        self.stack.pop()

    def backquoted(self, word: Word) -> None:
        self.take()
        self.stack.append("backtick")
        while self.peek() != "`":
            if self.peek() == "\\":
                self.take()
            self.take()
        self.take()
        self.stack.pop()
        word.add(EXPANSION, None, True)
        word.dynamic = True

    def ansi_c(self, word: Word) -> None:
        self.take()
        self.stack.append("ansic")
        while self.peek() != "'":
            if self.peek() == "\\":
                self.take()
            word.add(*self.take(), True)
        self.take()
        self.stack.pop()

    def nested(self, closer: str, context: str = "code") -> None:
        """``$( )``: commands of their own (:class:`~.lexer.Lexer`)."""
        raise NotImplementedError
