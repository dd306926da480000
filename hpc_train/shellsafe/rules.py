"""What a shell does with a character of a job value where it lands, and with the commands values end up in.

A job value must be inert where it lands: bash must neither expand it (``$( )``, backquotes, ``${ }``,
arithmetic, globs, word splitting), nor read it as syntax (an operator, the end of a quote, a heredoc or a
comment), nor run it as code (``eval``, ``bash -c``, ``trap``, a shell reading a heredoc or a pipe, ``su -c``,
``ssh HOST CMD``), nor let it name a variable or a shell builtin. Each rule here refuses, with :class:`Unsafe`,
the first character or command that breaks this; :mod:`.lexer` finds the context every character is read in.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Callable, Sequence

from .marks import RAW, Origin

if TYPE_CHECKING:
    from .lexer import Command, Word

PLAIN = frozenset(string.ascii_letters + string.digits + "_@%+=:,./-")
"""shlex.quote's own safe characters: inert unquoted, in double quotes and in a heredoc."""
IDENTIFIER = frozenset(string.ascii_letters + string.digits + "_")
DIGITS = frozenset(string.digits)
BLANKS = frozenset(" \t")

KEYWORDS = frozenset("if then else elif fi case esac for select while until do done in function time coproc "
                     "{ } ! [[ ]]".split())
BUILTINS = frozenset(". : [ alias bg bind break builtin caller cd command compgen complete compopt continue declare "
                     "dirs disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill "
                     "let local logout mapfile popd printf pushd pwd read readarray readonly return set shift "
                     "shopt source suspend test times trap true type typeset ulimit umask unalias unset wait".split())
SHELLS = frozenset("bash sh dash zsh ksh mksh ash busybox".split())
_LEADING = frozenset("if then else elif do while until ! { time".split())
_ENDING = frozenset("fi done esac }".split())
_DECLARE = frozenset("declare typeset local readonly export".split())
_NAMES = frozenset("read unset mapfile readarray".split())
_ARITH_TESTS = frozenset("-eq -ne -lt -le -gt -ge".split())

# Where a character is read (the lexer's context names), and what that means for a job value there.
WHERE = {
    "code": "unquoted, where the shell splits, globs and expands it",
    "sq": "inside single quotes, which its quote would end",
    "dq": "inside double quotes, where $( ), backquotes and ${ } still run",
    "ansic": "inside $'...'",
    "param_name": "as the name of a ${...} expansion",
    "param_word": "inside a ${...} expansion",
    "arith": "in arithmetic ($(( )), (( )), let, [[ -eq ]], an array index), where a name is evaluated as code",
    "backtick": "inside backquotes, which run it",
    "comment": "in a comment, which its newline would end",
    "heredoc": "in an unquoted heredoc (<<EOF), where $( ), backquotes and ${ } still run",
    "sbatch": "on an #SBATCH line, where sbatch splits and unquotes options",
    "sbatch'": "inside quotes on an #SBATCH line",
    'sbatch"': "inside quotes on an #SBATCH line",
}


class Unsafe(Exception):
    """A job value lands where a shell would expand, parse or run it; ``where`` says how it lands."""

    def __init__(self, origin: Origin, where: str) -> None:
        super().__init__(where)
        self.origin, self.where = origin, where


def check_char(ch: str, origin: Origin, context: str) -> None:
    """One character of a job value, read in ``context`` (a key of :data:`WHERE`)."""
    if not _inert(ch, origin.kind == RAW, context):
        raise Unsafe(origin, WHERE[context])


def _inert(ch: str, raw: bool, context: str) -> bool:
    if context == "code":  # a quoting filter's output may open and close its own quotes and separate words
        return ch in PLAIN or (not raw and (ch in BLANKS or ch in "'\""))
    if context == "sq":
        return ch != "'" or not raw
    if context in ("dq", "heredoc"):
        return ch not in "$`\\" and (ch != '"' or not raw or context == "heredoc")
    if context == "ansic":
        return ch not in "'\\"
    if context == "param_word":
        return ch in PLAIN
    if context == "arith":
        return ch in DIGITS
    if context == "comment":
        return ch != "\n"
    if context == "sbatch":
        return ch in PLAIN or (not raw and ch in "'\"")
    if context in ("sbatch'", 'sbatch"'):  # a backslash that escapes the closing quote leaves it open: unbalanced
        return ch != "\n" and (ch != context[-1] or not raw)
    return False  # param_name, backtick: no job value belongs there


def unbalanced(origin: Origin) -> Unsafe:
    return Unsafe(origin, "with quotes that do not close where they open")


# --------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------

Relex = Callable[[Sequence[tuple[str, "Origin | None"]], str], None]
"""Read characters (with their origins) as a script of their own: ``(chars, what runs them)``."""


def _first_origin(word: "Word", allowed: frozenset[str] = frozenset()) -> Origin | None:
    """The origin of the first job character of ``word`` outside ``allowed`` (None: there is none)."""
    for ch, origin, _quoted in word.chars:
        if origin is not None and ch not in allowed:
            return origin
    return None


def _refuse_in(word: "Word", allowed: frozenset[str], where: str) -> None:
    origin = _first_origin(word, allowed)
    if origin is not None:
        raise Unsafe(origin, where)


SHELL_READS = frozenset({"BASH_ENV", "ENV", "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS",
                         "IFS"})
"""Variables bash expands, runs or reads its script by: ``BASH_ENV='$(cmd)'`` runs cmd in every non-interactive
bash, ``PS4`` under xtrace, ``IFS`` re-splits the template's own words (docs/design.md, decision 3)."""


def _check_assigned(word: "Word", integers: set[str]) -> None:
    """The value of ``NAME=VALUE``: never a job value for a variable bash reads as code, or an integer one."""
    name = word.name_part.literal.split("[", 1)[0].rstrip("+")
    if name in SHELL_READS:
        _refuse_in(word.value_part, frozenset(), f"in {name}, which bash expands and runs or reads its script by")
    elif name in integers:
        _refuse_in(word.value_part, DIGITS, f"in {name}, declared an integer: {WHERE['arith']}")


def check_command(command: "Command", relex: Relex, integers: set[str] | None = None) -> None:
    """A simple command: its assignments, its command word and what its arguments become. ``integers``: the
    variables the script declared ``-i`` so far (an assignment to one is arithmetic)."""
    integers = set() if integers is None else integers
    words = list(command.words)
    if len(words) > 1 and not words[0].tainted and words[0].literal == "function":
        _refuse_in(words[1], IDENTIFIER, "as the name of a function")
        del words[:2]  # `function NAME { BODY`: the body's first command follows
    while words and not words[0].tainted and words[0].literal in _LEADING | _ENDING:
        words.pop(0)
    while words and words[0].assignment_name is not None:
        _refuse_in(words[0].name_part, frozenset(), "as the name of a variable it assigns")
        _check_assigned(words.pop(0), integers)
    if not words:
        return
    _check_command_word(words[0])
    _check_arguments(words, command, relex, integers)


_WRAPPERS = frozenset("command builtin exec nohup env time sudo timeout nice stdbuf taskset numactl".split())


def programs(command: "Command") -> list[str]:
    """The programs a simple command runs: its command word, and the one a wrapper (exec, env, nohup ...) runs."""
    words = [w for w in command.words if not (not w.tainted and w.literal in _LEADING | _ENDING)]
    words = [w for w in words if w.assignment_name is None] if words and words[0].assignment_name else words
    found = []
    for word in words:
        if word.literal.startswith("-") or word.assignment_name is not None:
            continue
        found.append(_program(word))
        if found[-1] not in _WRAPPERS:
            break
    return found


def _check_command_word(word: "Word") -> None:
    origin = _first_origin(word)
    if origin is None:
        return
    name = word.literal
    if word.dynamic:
        raise Unsafe(origin, "where the shell runs a command whose name it builds from an expansion")
    raw = next((o for _, o, _ in word.chars if o is not None and o.kind == RAW), None)
    if raw is not None:  # a program a template runs on purpose is quoted as a word (`{{ python | shquote }} -m ...`)
        raise Unsafe(raw, "where the shell runs a command, with no quoting filter saying it names a program")
    if name in KEYWORDS or name in BUILTINS:
        kind = "keyword" if name in KEYWORDS else "builtin"
        raise Unsafe(origin, f"where the shell runs a command, as the shell {kind} {name!r}")


def _program(word: "Word") -> str:
    return word.literal.rsplit("/", 1)[-1]


def _check_arguments(words: list["Word"], command: "Command", relex: Relex, integers: set[str]) -> None:
    name, args = _program(words[0]), words[1:]
    _check_code_arguments(name, args, relex)
    if name in ("command", "builtin", "exec", "nohup", "env", "time") and args:
        for word in args:
            if name == "env" and word.assignment_name is not None:
                _check_assigned(word, integers)  # env BASH_ENV=... bash
        if name == "command" and any(w.literal[:1] == "-" and set(w.literal[1:]) & {"v", "V"} for w in args):
            return  # command -v NAME looks NAME up, runs nothing
        rest = [w for before, w in zip([None, *args], args) if not w.literal.startswith("-")
                and w.assignment_name is None and not _is_option_argument(name, before)]
        if rest:
            check_command(command.with_words(rest), relex, integers)
        return
    if name == "eval":
        relex(_joined(args), "eval")
    elif name == "trap":
        actions = [w for w in args if not w.literal.startswith("-")]
        if actions and len(actions) > 1:
            relex(actions[0].code_chars(), "trap")
    elif name == "let":
        for word in args:
            _refuse_in(word, DIGITS, WHERE["arith"])
    elif name in _DECLARE:
        _check_declare(args, integers)
    elif name in _NAMES:
        for word in args:
            if not word.literal.startswith("-"):
                _refuse_in(word, IDENTIFIER, "as the name of a variable")
    elif name in ("printf", "wait", "test", "["):
        flag = {"printf": "-v", "wait": "-p"}.get(name, "-v")
        for before, word in zip(args, args[1:]):
            if before.literal == flag and not before.tainted:
                _refuse_in(word, IDENTIFIER, "as the name of a variable")
    elif name in ("source", ".") and (not args or args[0].literal in STDIN_FILES):
        _stdin_is_code(command, relex, name)
    elif name in ("source", ".") and args[0].substituted is not None:
        raise Unsafe(args[0].substituted, f"in a process substitution {name} runs as its script")
    _check_shells(words, command, relex)


_CODE_OPTIONS = {"su": ("-c", "--command"), "runuser": ("-c", "--command"), "flock": ("-c", "--command"),
                 "script": ("-c", "--command"), "sbatch": ("--wrap",), "env": ("-S", "--split-string")}
"""Programs that give one option's argument to ``sh -c`` (``env -S`` splits and expands it itself)."""
_REMOTE_SHELLS = {"ssh": "BbcDEeFIiJLlmOopQRSWw", "watch": "dnq"}
"""Programs that join their operands after the first (ssh: after the host) or all of them (watch) and give
them to a shell; the option letters that take an argument."""


def _check_code_arguments(name: str, args: Sequence["Word"], relex: Relex) -> None:
    """``su -c CODE``, ``flock FILE -c CODE``, ``sbatch --wrap=CODE``, ``ssh HOST CODE...``, ``watch CODE...``."""
    for before, word in zip([None, *args], args):
        text = word.literal
        for option in _CODE_OPTIONS.get(name, ()):
            if before is not None and before.literal == option and not before.tainted:
                relex(word.code_chars(), f"{name} {option}")
            elif option.startswith("--") and text.startswith(option + "="):
                relex(word.code_chars()[len(option) + 1:], f"{name} {option}")
    if name not in _REMOTE_SHELLS:
        return
    i = 0
    while i < len(args) and args[i].literal.startswith("-") and args[i].literal != "--":
        last = args[i].literal[-1]
        i += 2 if len(args[i].literal) == 2 and last in _REMOTE_SHELLS[name] else 1
    operands = args[i + (i < len(args) and args[i].literal == "--"):]
    code = operands[1:] if name == "ssh" else operands
    if code:
        relex(_joined(code), name)


_WRAPPER_OPTION_ARGS = {"env": ("-u", "--unset", "-C", "--chdir", "-S", "--split-string"), "exec": ("-a",)}


def _is_option_argument(wrapper: str, before: "Word | None") -> bool:
    """``env -u NAME``: the word after an option that takes one is not the command the wrapper runs."""
    return before is not None and not before.tainted and before.literal in _WRAPPER_OPTION_ARGS.get(wrapper, ())


def _joined(words: Sequence["Word"]) -> list[tuple[str, Origin | None]]:
    chars: list[tuple[str, Origin | None]] = []
    for i, word in enumerate(words):
        if i:
            chars.append((" ", None))
        chars.extend(word.code_chars())
    return chars


def _check_declare(args: Sequence["Word"], integers: set[str]) -> None:
    options = "".join(w.literal[1:] for w in args if w.literal.startswith("-") and not w.tainted)
    for word in args:
        if word.literal.startswith(("-", "+")) and not word.tainted:
            continue
        _refuse_in(word.name_part, IDENTIFIER, "as the name of a variable")
        if "i" in options:
            integers.add(word.name_part.literal)
        if word.name_part.literal in SHELL_READS or word.name_part.literal in integers:
            _check_assigned(word, integers)
        elif "i" in options:
            _refuse_in(word.value_part, DIGITS, WHERE["arith"])
        elif "n" in options:
            _refuse_in(word.value_part, IDENTIFIER, "as the name of a variable (a nameref)")
        elif word.value_part.literal.startswith("("):  # -a, -A, or a variable already an array: `( )` is evaluated
            _refuse_in(word.value_part, frozenset(), "in a ( ) value of declare, which bash evaluates as an "
                                                     "array's assignment, its [ ] indexes as arithmetic")


_SHELL_OPTION_ARGS = frozenset("--rcfile --init-file".split())
"""Long options of bash whose argument is the next word (``-o NAME`` and ``-O NAME`` are the short ones)."""
STDIN_FILES = frozenset("/dev/stdin /dev/fd/0 /proc/self/fd/0 -".split())
"""Script operands that name the shell's (or ``source``'s) standard input."""


def _check_shells(words: Sequence["Word"], command: "Command", relex: Relex) -> None:
    """``bash -c CODE`` anywhere in the command (after srun, sudo, xargs ...), and a shell reading its code
    from its standard input (a heredoc, a here-string, a pipe, ``/dev/fd/0``) or a process substitution."""
    for at, word in enumerate(words):
        if word.tainted or _program(word) not in SHELLS:
            continue
        reads_c, reads_stdin, operands = _shell_invocation(words[at + 1:])
        if reads_c:
            if operands:
                relex(operands[0].code_chars(), f"{_program(word)} -c")
            return
        if reads_stdin or not operands or operands[0].literal in STDIN_FILES:
            _stdin_is_code(command, relex, _program(word))
        elif operands[0].substituted is not None:
            raise Unsafe(operands[0].substituted, f"in a process substitution {_program(word)} runs as its script")
        return


def _shell_invocation(rest: Sequence["Word"]) -> tuple[bool, bool, list["Word"]]:
    """How bash reads its arguments: option clusters (``-euo pipefail``: ``o`` and ``O`` take the next word),
    long options (``--rcfile FILE``), ``--`` or ``-`` ending them, then the operands; whether ``-c`` (the
    first operand is code) or ``-s`` (standard input is) is among the options."""
    reads_c = reads_stdin = False
    i = 0
    while i < len(rest):
        text = rest[i].literal
        if not text.startswith(("-", "+")) or text == "+":
            break
        origin = _first_origin(rest[i])
        if origin is not None:  # a job value the shell would take as an option (-c makes the next word code)
            raise Unsafe(origin, "as an option of a shell")
        i += 1
        if text in ("--", "-"):
            break
        if text.startswith("--"):
            i += text in _SHELL_OPTION_ARGS
            continue
        reads_c = reads_c or "c" in text[1:]
        reads_stdin = reads_stdin or "s" in text[1:]
        i += sum(letter in "oO" for letter in text[1:])
    return reads_c, reads_stdin, list(rest[i:])


def _stdin_is_code(command: "Command", relex: Relex, reader: str) -> None:
    for heredoc in command.heredocs:
        relex(heredoc.body, f"{reader} reading a heredoc")
    for word in command.herestrings:
        relex(word.code_chars(), f"{reader} reading a here-string")
    origin = command.piped_in()
    if origin is not None:  # what the commands before the pipe print is code: no job value may be in them
        raise Unsafe(origin, f"in a pipe that feeds {reader}, which runs what it reads as code")


def check_double_brackets(words: Sequence["Word"]) -> None:
    """``[[ ... ]]``: the operands of -eq/-lt/... are evaluated as arithmetic, quoted or not; ``-v NAME`` too."""
    for before, word, after in zip([None, *words], words, [*words[1:], None]):
        operators = {w.literal for w in (before, after) if w is not None and not w.tainted}
        if operators & _ARITH_TESTS:
            _refuse_in(word, DIGITS, WHERE["arith"])
        if before is not None and before.literal == "-v" and not before.tainted:
            _refuse_in(word, IDENTIFIER, "as the name of a variable")
