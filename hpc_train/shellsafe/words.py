"""What the reader of :mod:`.lexer` hands the rules: words after quote removal (each character with the job
value it came from), here-documents and simple commands."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .marks import RAW, Origin

EXPANSION = "\x01"
"""An expansion in a word's text after quote removal: its value exists only when the script runs."""
TEMPLATE_QUOTED = "template"
"""A word character's ``quoted`` when the template's own quotes (not a job value's) enclose it: the character
reaches a shell that runs the word as code exactly as the template wrote it (truthy, as ``True`` is)."""
IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")

Chars = list[tuple[str, "Origin | None"]]


@dataclass
class Word:
    chars: list[tuple[str, Origin | None, bool | str]] = field(default_factory=list)
    """Characters after quote removal: (character, the value it came from or None, whether it was quoted:
    :data:`TEMPLATE_QUOTED` by the template's own quotes)."""
    dynamic: bool = False
    """It holds an expansion (``$x``, ``$( )``, ...), shown as :data:`EXPANSION` in :attr:`literal`."""
    substituted: Origin | None = None
    """A process substitution ``<( )`` (a file whose text its commands print): the first job value in it."""

    def add(self, ch: str, origin: Origin | None, quoted: bool | str) -> None:
        self.chars.append((ch, origin, quoted))

    @property
    def literal(self) -> str:
        return "".join(c for c, _, _ in self.chars)

    @property
    def tainted(self) -> bool:
        return any(o is not None for _, o, _ in self.chars)

    def code_chars(self) -> Chars:
        """The word as code a command runs (``bash -c WORD``): a value keeps its kind where the template's own
        quotes kept every character of it as its filter wrote it (``bash -c "cd x && ls {{ d | shquote }}"``);
        one whose quotes this word's quote removal took off is bare text to that shell (:data:`~.marks.RAW`)."""
        bare = {o.index for _, o, q in self.chars if o is not None and q != TEMPLATE_QUOTED}
        return [(c, Origin(o.index, RAW) if o is not None and o.index in bare else o) for c, o, _ in self.chars]

    @property
    def assignment_name(self) -> str | None:
        """NAME of an assignment word (``NAME=``, ``NAME+=``, ``NAME[i]=``, written unquoted), else None."""
        text = "".join(c if not q else "\x02" for c, _, q in self.chars)
        end = 0
        while end < len(text) and (text[end] in IDENT_START or (end and text[end].isdigit())):
            end += 1
        if not end:
            return None
        rest = text[end:]
        if rest.startswith("[") and "]" in rest:
            rest = rest[rest.index("]") + 1:]
        return text[:end] if rest.startswith(("=", "+=")) else None

    def _split(self) -> tuple["Word", "Word"]:
        at = self.literal.find("=")
        if at < 0:
            return self, Word()
        return Word(self.chars[:at]), Word(self.chars[at + 1:])

    @property
    def name_part(self) -> "Word":
        """What comes before the first ``=`` (the whole word without one)."""
        return self._split()[0]

    @property
    def value_part(self) -> "Word":
        return self._split()[1]


@dataclass
class Heredoc:
    delimiter: str
    quoted: bool
    strip_tabs: bool
    read_body: Callable[[], Chars] = lambda: []

    @property
    def body(self) -> Chars:
        return self.read_body()


@dataclass
class Command:
    words: list[Word] = field(default_factory=list)
    heredocs: list[Heredoc] = field(default_factory=list)
    herestrings: list[Word] = field(default_factory=list)
    piped_in: Callable[[], "Origin | None"] = lambda: None
    """The first job value in the commands that pipe into this one (``... | bash``), heredocs included."""

    def with_words(self, words: list[Word]) -> "Command":
        return Command(words, self.heredocs, self.herestrings, self.piped_in)

    @property
    def empty(self) -> bool:
        return not (self.words or self.heredocs or self.herestrings)
