"""The one error family of hpc-train.

Library code raises these; only the CLI (``hpc_train/cli/__init__.py``) turns them into click errors and
exit codes, so nothing here imports click. Messages say what is wrong *and* what to do about it, in one or two lines.
"""

from __future__ import annotations


class HpcTrainError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 2


class ConfigError(HpcTrainError):
    """A job file, site file, ``--set`` override or flag is invalid (exit 2)."""


class TemplateError(HpcTrainError):
    """A template is missing or does not render; the message names file and line (exit 2)."""


class SubmitError(HpcTrainError):
    """The scheduler refused or could not be reached (exit 2: nothing was queued)."""


class SubmitInterrupted(SubmitError):
    """Ctrl-C while sbatch ran; the message says what became of the job (exit 130, as a shell's Ctrl-C)."""

    exit_code = 130


class ProvisionError(HpcTrainError):
    """ansible-playbook is missing or the inventory is unusable (exit 2)."""


class JobFailedError(HpcTrainError):
    """A job or run ended unsuccessfully (exit 1)."""

    exit_code = 1
