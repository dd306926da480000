"""A rendered script read the way bash reads it, as far as the safety rules need (:mod:`.rules`): the context
every character of a job value is read in (quotes, ``$( )``, ``${ }``, arithmetic, a comment or ``#SBATCH``
line, a quoted or unquoted heredoc), and the simple commands the values end up in (their words after quote
removal, here-documents, here-strings), which :func:`.rules.check_command` judges.

It follows bash's grammar for what templates write — quotes, escapes, expansions, operators, redirections,
heredocs, ``case``, ``[[ ]]``, ``(( ))``, subshells and groups — and reads the text of ``eval``, ``bash -c``,
``trap`` and of a heredoc a shell reads as a script of its own. What it cannot follow (a quote or ``$(`` left
open) is :class:`Unreadable`: then where values land cannot be told, and nothing is let through.
"""

from __future__ import annotations

from typing import Callable, Sequence

from . import rules
from .marks import RAW, Origin, Region
from .reader import META, Reader, Unreadable
from .rules import Unsafe
from .words import EXPANSION, Command, Heredoc, Word

MAX_NESTING = 8
"""Code inside code (``eval "bash -c '...'"``) is read this deep, then refused."""


class Lexer(Reader):
    """One script (or a piece of code a command runs): :meth:`run` reads it all, raising :class:`~.rules.Unsafe`
    at the first job value a shell would not leave alone."""

    def __init__(self, text: str, regions: Sequence[Region], depth: int = 0) -> None:
        super().__init__(text, regions, depth)
        self.pending: list[Heredoc] = []
        self.line: list[Command] = []
        self.integers: set[str] = set()
        """The variables the script declared ``-i`` so far: assigning one evaluates the value as arithmetic."""
        self.heredocs_at: list[tuple[int, Heredoc]] = []
        """Every heredoc of the script, with where its ``<<`` is (a pipe's feeders are found by position)."""
        self.programs: set[str] = set()
        """Every program a command of the script runs (``srun``, ``python`` ...), code a command runs included."""

    # -- the script --------------------------------------------------------------------------------
    def run(self) -> None:
        self.script()
        self.newline()
        self.leave()

    def script(self, closer: str = "", stops: tuple[str, ...] = (), stop_words: tuple[str, ...] = ()) -> str:
        """Commands until the end, ``closer`` (taken), a case terminator in ``stops`` or a command word in
        ``stop_words`` (both taken and returned)."""
        command = Command()
        pipeline = _Pipeline(self.i)
        while True:
            if self.i >= self.n:
                self.end(command)
                if closer:
                    raise Unreadable(f"a closing {closer!r} is missing")
                return ""
            c = self.peek()
            stop = next((s for s in (closer, *stops) if s and self.at(s)), None)
            if stop:
                self.end(command)
                for _ in stop:
                    self.take()
                return stop
            if c in (" ", "\t"):
                self.take()
            elif c == "\\" and self.peek(1) == "\n":
                self.take(), self.take()
            elif c == "\n":
                self.take()
                command = self.end(command)
                pipeline.start = self.i
                self.newline()
            elif c == "#":
                self.comment()
            elif c in ";&|" and not (c == "&" and self.peek(1) == ">"):
                at = self.i
                self.take()
                if c in "&|" and self.peek() in ("&", "|"):
                    self.take()
                command = self.end(command)
                if self.text[at:self.i] in ("|", "|&"):
                    command.piped_in = self.feeder(pipeline.start, at)
                else:
                    pipeline.start = self.i
            elif c == "(" and not command.words:
                if self.at("(("):
                    self.take(), self.take()
                    self.arithmetic("))")
                else:
                    self.take()
                    self.nested(")")
            elif c in "()":
                self.take()  # NAME () of a function definition: its body's first command is one of its own
                if c == ")":
                    command = self.end(command)
            elif c in "<>&":
                self.redirection(command)
            else:
                word = self.word()
                if word.assignment_name is not None and word.literal.endswith("=") and self.peek() == "(":
                    self.array_elements()
                if not command.words and not word.tainted and word.literal in stop_words:
                    self.end(command)
                    return word.literal
                pipeline.group(word, first=not command.words)
                command = self.command_word(command, word)

    def command_word(self, command: Command, word: Word) -> Command:
        """Add ``word`` to ``command``, or read the compound command it starts (case, [[ ]], for (( )))."""
        first = not command.words and not word.tainted
        if word.literal.isdigit() and self.peek() in ("<", ">"):
            return command  # a file descriptor: 2>/dev/null
        if first and word.literal == "case":
            self.case_clause()
            return self.end(command)
        if first and word.literal == "[[":
            self.double_brackets()
            return command
        command.words.append(word)
        if first and word.literal == "for":
            self.skip_blanks()
            if self.at("(("):
                self.take(), self.take()
                self.arithmetic("))")
        return command

    def feeder(self, start: int, end: int) -> Callable[[], Origin | None]:
        """What tells the first job value in the text ``start:end`` that pipes into a command, and in the
        heredocs of its commands (their bodies are read once the line ends)."""
        heredocs = [heredoc for at, heredoc in self.heredocs_at if start <= at < end]

        def first_value() -> Origin | None:
            found = self.tainted_between(start, end)
            bodies = (origin for heredoc in heredocs for _, origin in heredoc.body if origin is not None)
            return found if found is not None else next(bodies, None)
        return first_value

    def end(self, command: Command) -> Command:
        if not command.empty:
            self.line.append(command)
        return Command()

    def newline(self) -> None:
        """A line has ended: its heredocs' bodies follow, then its commands can be judged."""
        pending, self.pending = self.pending, []
        for heredoc in pending:
            self.heredoc_body(heredoc)
        self.flush()

    def flush(self) -> None:
        line, self.line = self.line, []
        for command in line:
            self.programs.update(rules.programs(command))
            rules.check_command(command, self.relex, self.integers)

    def nested(self, closer: str, context: str = "code") -> None:
        """``$( )``, ``( )``, ``<( )``: commands of their own, judged when they close."""
        saved, self.line = self.line, []
        self.stack.append(context)
        self.script(closer=closer)
        self.flush()
        self.stack.pop()
        self.line = saved

    def relex(self, chars: Sequence[tuple[str, Origin | None]], what: str) -> None:
        """Text a command runs as code (``eval``, ``bash -c``, ``trap``, a heredoc a shell reads); each value's
        kind as ``chars`` give it (:meth:`~.words.Word.code_chars`: bare where its quotes were removed)."""
        if self.depth >= MAX_NESTING:
            raise Unreadable("code that runs code is nested too deep")
        regions: list[Region] = []
        whole = {o.index: sum(r.end - r.start for r in self.regions if r.origin.index == o.index)
                 for _, o in chars if o is not None}
        present = {index: sum(1 for _, o in chars if o is not None and o.index == index) for index in whole}
        for at, (_, origin) in enumerate(chars):
            if origin is None:
                continue
            if present[origin.index] != whole[origin.index]:  # part of it is not here: its quoting is not either
                origin = Origin(origin.index, RAW)
            if regions and regions[-1].origin == origin and regions[-1].end == at:
                regions[-1] = Region(regions[-1].start, at + 1, origin)
            else:
                regions.append(Region(at, at + 1, origin))
        code = Lexer("".join(c for c, _ in chars), regions, self.depth + 1)
        code.integers = self.integers  # eval's code shares the shell's variables (bash -c's inherits none: stricter)
        try:
            code.run()
        except Unsafe as exc:
            raise Unsafe(exc.origin, f"in code that {what} runs, {exc.where}") from None
        except Unreadable:
            if regions:  # text with job values in it must be readable; other code is its own business
                raise
        self.programs |= code.programs

    # -- comments, redirections, heredocs ------------------------------------------------------------
    def comment(self) -> None:
        line_start = self.i == 0 or self.text[self.i - 1] == "\n"
        self.take()
        if line_start and self.at("SBATCH"):
            self.sbatch_line()
            return
        self.stack.append("comment")
        while self.peek() not in ("\n", ""):
            self.take()
        self.leave()  # a value that ends the line ends in the comment
        self.stack.pop()

    def sbatch_line(self) -> None:
        """An ``#SBATCH`` line, split as sbatch splits it (quotes, backslash escapes, a ``#`` comment)."""
        self.stack.append("sbatch")
        escaped = False
        while self.peek() not in ("\n", ""):
            state = self.stack[-1]
            ch, _ = self.take()
            if escaped or state == "comment":
                escaped = False
            elif ch == "\\":
                escaped = True
            elif state == "sbatch" and ch in ("'", '"'):
                self.stack[-1] = "sbatch" + ch
            elif state == "sbatch" and ch == "#":
                self.stack[-1] = "comment"
            elif state != "sbatch" and ch == state[-1]:
                self.stack[-1] = "sbatch"
        self.leave()
        self.stack.pop()

    def redirection(self, command: Command) -> None:
        if self.at("<<<"):
            for _ in "<<<":
                self.take()
            self.skip_blanks()
            command.herestrings.append(self.word())
        elif self.at("<<"):
            self.take(), self.take()
            strip_tabs = self.peek() == "-"
            if strip_tabs:
                self.take()
            self.skip_blanks()
            word = self.word()
            if word.tainted:
                raise Unsafe(next(o for _, o, _ in word.chars if o is not None), "as the line that ends a heredoc")
            if word.dynamic:  # bash expands nothing in it: <<$X ends at a line `$X`, which this reader cannot spell
                raise Unreadable("a heredoc delimiter with an expansion in it")
            heredoc = Heredoc(word.literal, any(q for _, _, q in word.chars), strip_tabs)
            self.heredocs_at.append((self.i, heredoc))
            self.pending.append(heredoc)
            command.heredocs.append(heredoc)
        elif self.at("<(") or self.at(">("):
            start = self.i
            self.take(), self.take()
            self.nested(")")
            command.words.append(Word([(EXPANSION, None, False)], dynamic=True,
                                      substituted=self.tainted_between(start, self.i)))
        else:
            while self.peek() and self.peek() in "<>&|":
                self.take()
            self.skip_blanks()
            self.word()  # the file (or descriptor) redirected to

    def heredoc_body(self, heredoc: Heredoc) -> None:
        start, pos, end = self.i, self.i, self.n
        while pos < self.n:
            eol = self.text.find("\n", pos)
            eol = self.n if eol < 0 else eol
            line = self.text[pos:eol]
            if (line.lstrip("\t") if heredoc.strip_tabs else line) == heredoc.delimiter:
                end = pos
                break
            pos = eol + 1
        heredoc.read_body = lambda: [(self.text[j], self.origin(j)) for j in range(start, end)]
        if not heredoc.quoted:
            self.stack.append("heredoc")
            while self.i < end:
                self.heredoc_char()
            self.leave()
            self.stack.pop()
        eol = self.text.find("\n", end)
        eol = self.n if eol < 0 else eol
        found = self.tainted_between(end, eol) if end < self.n else None
        if found is not None:
            raise Unsafe(found, "as the line that ends a heredoc")
        self.leave()
        self.i = min(eol + 1, self.n)

    def heredoc_char(self) -> None:
        c = self.peek()
        if c == "$":
            self.dollar(Word(), quoted=True)
        elif c == "`":
            self.backquoted(Word())
        else:
            self.take()
            if c == "\\" and self.peek() in ("$", "`", "\\", "\n"):
                self.take()

    def array_elements(self) -> None:
        """``NAME=( ... )``, ``NAME+=( ... )``: words up to ``)``, each expanded as an argument is (never a
        command); an unquoted ``[index]=`` before one is arithmetic."""
        self.take()
        while True:
            self.skip_space()
            if self.peek() == ")":
                self.take()
                return
            if self.peek() == "[":
                self.take()
                self.arithmetic("]")
            if not self.word().chars and self.peek() not in (" ", "\t", "\n", ")", "#"):
                raise Unreadable(f"{self.peek() or 'the end'} inside an array assignment ( )")

    # -- compound commands ---------------------------------------------------------------------------
    def case_clause(self) -> None:
        self.skip_blanks()
        self.word()  # the subject
        self.skip_space()
        if self.word().literal != "in":
            raise Unreadable("a case without its 'in'")
        while True:
            self.skip_space()
            if self.peek() == "(":
                self.take()
            first = self.word()
            if first.literal == "esac" and not first.tainted:
                return
            self.skip_blanks()
            while self.peek() == "|":
                self.take()
                self.skip_blanks()
                self.word()
                self.skip_blanks()
            if self.peek() != ")":
                raise Unreadable("a case pattern without its ')'")
            self.take()
            if self.script(stops=(";;&", ";;", ";&"), stop_words=("esac",)) in ("esac", ""):
                return

    def skip_space(self) -> None:
        """Blanks, newlines and comments between the parts of a compound command."""
        while True:
            self.skip_blanks()
            if self.peek() == "\n":
                self.take()
                self.newline()
            elif self.peek() == "#":
                self.comment()
            else:
                return

    def double_brackets(self) -> None:
        words: list[Word] = []
        while True:
            self.skip_blanks()
            if not self.peek():
                raise Unreadable("a [[ without its ]]")
            if self.peek() in META:
                ch, origin = self.take()
                if ch in "&|" and self.peek() == ch:
                    self.take()
                words.append(Word([(ch, origin, False)]))
                continue
            word = self.word()
            if word.literal == "]]" and not word.tainted:
                break
            words.append(word)
        rules.check_double_brackets(words)


class _Pipeline:
    """Where the pipeline being read starts: a compound command (``{ ...; }``, ``if ... fi``, a loop) is one
    element of it, however many lists it holds."""

    _OPENS = frozenset("{ if while until for select".split())
    _CLOSES = frozenset("} fi done".split())

    def __init__(self, start: int) -> None:
        self.start = start
        self.group_starts: list[int] = []

    def group(self, word: Word, *, first: bool) -> None:
        if not first or word.tainted:
            return
        if word.literal in self._OPENS:
            self.group_starts.append(self.start)
        elif word.literal in self._CLOSES and self.group_starts:
            self.start = self.group_starts.pop()
