"""Where a command job's program is (``hpc-train submit -- CMD``, ``command:``).

A command job runs in its run's own ``<run_dir>/work`` by default (``workdir: run``, docs/commands.md "Where a
client's files go"), yet a relative program (``./train.sh``, ``scripts/train.sh``) or the SCRIPT of ``python
SCRIPT`` still means the file the user sees in the submit directory: the job keeps the words as typed, and the
rank wrapper (:mod:`hpc_train.rank.command`) makes them absolute against the directory it was started in (the
submit directory, under every launcher) before it changes into the run's. ``submit`` checks them first: a relative
one that is not a file in the submit directory is exit 2, nothing queued (it could only fail on every rank later).
A local run checks the program on PATH and absolute paths too (its ranks run here, with this PATH).

Not checked at a Slurm submit, because the login node cannot know: a program found on the ranks' PATH (the
batch script's modules change it) and absolute paths (a node or a container may have files the login node
lacks). The rank wrapper checks the python SCRIPT just before it starts the command, and exec the program: a
missing one is exit 127, "program not found: NAME", the run's reason.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..errors import ConfigError

PYTHON_WORDS = ("python", "python3")
"""A first word that means the job's interpreter (:func:`hpc_train.rank.command.resolve_program`)."""

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")
"""A program that is a Python interpreter (``python``, ``python3.12``, ``.venv/bin/python``): its SCRIPT is a file."""


def is_python(program: str) -> bool:
    return bool(_PYTHON_NAME.fullmatch(Path(program).name))


def read_python_options(words: list[str]) -> tuple[list[str], str | None, int]:
    """python's own options at the start of ``words`` (its command line after the interpreter), read as python reads
    them: one-letter options cluster (``-uX dev``, ``-Bm MOD``), ``-W``/``-X`` take the rest of the word or the next
    word, ``--check-hash-based-pycs`` the next word, ``--`` ends them. Returns the option words (of a cluster that
    holds ``-c``/``-m``, the letters before it), what comes after them and where: ``"script"`` (``words[i]`` is the
    SCRIPT), ``"c"``/``"m"`` (``words[i]`` holds that letter; the code or module follows), ``"-"`` (stdin), or None
    (no program)."""
    options: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--check-hash-based-pycs":
            options += words[index:index + 2]
            index += 2
        elif word == "--":
            after = index + 1
            return options, (None if after == len(words) else "-" if words[after] == "-" else "script"), after
        elif word == "-":
            return options, "-", index
        elif not word.startswith("-"):
            return options, "script", index
        elif word.startswith("--"):
            options.append(word)
            index += 1
        else:
            taken, program = _short_cluster(word, words[index + 1:index + 2])
            options += taken
            if program is not None:
                return options, program, index
            index += len(taken)  # the word, and the next one when -W/-X took it as its value
    return options, None, index


def _short_cluster(word: str, following: list[str]) -> tuple[list[str], str | None]:
    """A word of one-letter options: the option words it makes (with the next word, when ``-W``/``-X`` ends it and
    takes that as its value), and the program letter (``c``: code, ``m``: a module) that ends the options in it."""
    letters = word[1:]
    for position, letter in enumerate(letters):
        if letter in "cm":
            before = letters[:position]
            return ([f"-{before}"] if before else []), letter
        if letter in "WX":
            return ([word] if letters[position + 1:] else [word, *following]), None
    return [word], None


def script_index(argv: tuple[str, ...] | list[str]) -> int | None:
    """The position of SCRIPT in ``python [OPTIONS] SCRIPT [ARGS]``; None when the program is not python or runs
    no script file (``-c``, ``-m``, ``-``, nothing)."""
    if not argv or not is_python(argv[0]):
        return None
    _, program, at = read_python_options(list(argv[1:]))
    return 1 + at if program == "script" else None


def relative_paths(argv: tuple[str, ...]) -> list[int]:
    """Positions of the words that name a file by a path relative to the submit directory: a program with a
    ``/`` in it (a bare name is looked up on PATH, as a shell does) and python's SCRIPT."""
    positions = []
    if "/" in argv[0] and not Path(argv[0]).is_absolute():
        positions.append(0)
    script = script_index(argv)
    if script is not None and not Path(argv[script]).is_absolute():
        positions.append(script)
    return positions


def anchored(argv: list[str], submit_dir: Path) -> list[str]:
    """``argv`` with its relative program and python SCRIPT made absolute in ``submit_dir`` (what a
    ``workdir: run`` rank execs: it runs elsewhere, the words mean the submit directory's files)."""
    words = list(argv)
    for position in relative_paths(argv):
        words[position] = str(submit_dir / words[position])
    return words


def check_in_submit_dir(spec, submit_dir: Path) -> None:
    """At submit: a relative program or python SCRIPT must be a file in the submit directory; else exit 2."""
    for position in relative_paths(spec.command) if spec.command else ():
        path = submit_dir / spec.command[position]
        if not path.is_file():
            what = "no such file" if not path.exists() else "not a regular file"
            raise ConfigError(f"program not found: {spec.command[position]} ({what} in the submit directory "
                              f"{submit_dir})")


def check_found_here(spec, search_path: str | None) -> None:
    """A local run (the ranks run on this machine, with this PATH or ``slurm.env``'s): the program and an absolute
    python SCRIPT are checked at submit too, exit 2 naming the missing one, nothing started. (On a cluster the
    rank wrapper checks them on the node: exit 127.)"""
    if not spec.command:
        return
    argv = spec.command
    program = argv[0]
    if program in PYTHON_WORDS:
        pass  # the job's interpreter, the one running this
    elif "/" not in program:
        if shutil.which(program, path=search_path) is None:
            raise ConfigError(f"program not found: {program} (not on PATH)")
    elif not Path(program).is_file():
        raise ConfigError(f"program not found: {program}")
    script = script_index(argv)
    if script is not None and not Path(argv[script]).is_file():
        raise ConfigError(f"program not found: {argv[script]}")
