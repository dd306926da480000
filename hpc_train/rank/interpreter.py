"""The interpreter's own options of this process (``-X dev``, ``-W error``, ``-O``, ``-u``, ``-E``...), for a process
that starts itself again with another program (``hpc-train train`` becomes ``python -m hpc_train.train``; a
``train`` run alone ``exec``s itself with its run directory in its environment). Without them the new process
silently ran without the developer mode or the warning filters it was started with. Torch-free, stdlib only.

``sys.orig_argv`` is the command line as the OS gave it: the interpreter, its options, then the program
(``-m MOD``, ``-c CODE``, a script path: a console script's path, or ``-``) and the program's arguments, which are
``sys.argv[1:]``. The options are read as python reads them: one-letter options cluster (``-uX dev``, ``-Bm MOD``),
``-W``/``-X`` take the rest of the word or the next word, ``--check-hash-based-pycs`` the next word.
"""

from __future__ import annotations

import sys

_VALUE_LETTERS = "WX"
_PROGRAM_LETTERS = "cm"  # the program's text or module follows: the options end here
_LONG_WITH_VALUE = ("--check-hash-based-pycs",)


def interpreter_options(orig_argv: list[str] | None = None, argv: list[str] | None = None) -> list[str]:
    """The option words of the interpreter's command line (``sys.orig_argv``), without the program and its
    arguments (``sys.argv``), ready to be put between the interpreter and a new program."""
    orig = list(sys.orig_argv if orig_argv is None else orig_argv)
    args = list(sys.argv if argv is None else argv)
    head = orig[1:len(orig) - (len(args) - 1)] if len(args) > 1 else orig[1:]  # options + the program
    options: list[str] = []
    index = 0
    while index < len(head):
        word = head[index]
        if word in _LONG_WITH_VALUE:
            options += head[index:index + 2]
            index += 2
        elif word == "-" or word == "--" or not word.startswith("-"):
            break  # stdin, the end of the options, or a script path
        elif word.startswith("--"):
            options.append(word)
            index += 1
        else:
            taken, ends = _short_cluster(word, head[index + 1:index + 2])
            options += taken
            if ends:
                break
            index += 1 + (len(taken) - 1)
    return options


def _short_cluster(word: str, following: list[str]) -> tuple[list[str], bool]:
    """A word of one-letter options: the option words it makes (with the next word, when ``-W``/``-X`` ends it and
    takes that as its value), and whether a program letter (``-c``, ``-m``) ends the options in it."""
    letters = word[1:]
    for position, letter in enumerate(letters):
        if letter in _PROGRAM_LETTERS:
            before = letters[:position]
            return ([f"-{before}"] if before else []), True
        if letter in _VALUE_LETTERS:
            if letters[position + 1:]:
                return [word], False
            return [word, *following], False
    return [word], False
