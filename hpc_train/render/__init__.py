"""Rendering sbatch scripts: pure functions from a job to text (no Slurm, no submitit, nothing written).

* :mod:`.jinja` — the Jinja environment: search path, compile cache, and the rule that a ``{{ }}`` prints
  only hpc-train's own words (a job value is refused with the template's file and line);
* :mod:`.header` — the comment lines and ``#SBATCH`` lines, written by Python from the fields that declare them;
* :mod:`.variables` — the preamble: every job value the script reads, in a read-only ``HT_`` variable;
* :mod:`.script` — ``render_sbatch`` and ``LaunchSpec``;
* :mod:`.plain` — ``render_plain``, the script ``hpc-train render`` prints.
"""

from ..resources import templates_dir
from .jinja import ScriptText, environment, list_templates, search_path, template_source
from .header import sbatch_value
from .plain import render_plain, resolve_python
from .script import LAUNCHES_ITSELF, LaunchSpec, array_tasks, render_sbatch, watchdog_on

__all__ = ["LAUNCHES_ITSELF", "LaunchSpec", "ScriptText", "array_tasks", "environment", "list_templates",
           "render_plain", "render_sbatch", "resolve_python", "sbatch_value", "search_path", "template_source",
           "templates_dir", "watchdog_on"]
