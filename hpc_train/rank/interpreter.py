"""The interpreter's own options of this process (``-X dev``, ``-W error``, ``-O``, ``-u``, ``-E``...), for a process
that starts itself again with another program (``hpc-train train`` becomes ``python -m hpc_train.train``; a
``train`` run alone ``exec``s itself with its run directory in its environment). Without them the new process
silently ran without the developer mode or the warning filters it was started with. Torch-free.

``sys.orig_argv`` is the command line as the OS gave it: the interpreter, its options, then the program
(``-m MOD``, ``-c CODE``, a script path: a console script's path, or ``-``) and the program's arguments, which are
``sys.argv[1:]``. The options are read as python reads them, by the reader the command jobs' ``python SCRIPT`` uses
(:func:`hpc_train.config.command_paths.read_python_options`).
"""

from __future__ import annotations

import sys

from ..config.command_paths import read_python_options


def interpreter_options(orig_argv: list[str] | None = None, argv: list[str] | None = None) -> list[str]:
    """The option words of the interpreter's command line (``sys.orig_argv``), without the program and its
    arguments (``sys.argv``), ready to be put between the interpreter and a new program."""
    orig = list(sys.orig_argv if orig_argv is None else orig_argv)
    args = list(sys.argv if argv is None else argv)
    head = orig[1:len(orig) - (len(args) - 1)] if len(args) > 1 else orig[1:]  # options + the program
    options, _, _ = read_python_options(head)
    return options


def same_interpreter(*program: str) -> list[str]:
    """The argv that runs ``program`` (``-m MOD ARGS...``) with this interpreter and its own options."""
    return [sys.executable, *interpreter_options(), *program]
