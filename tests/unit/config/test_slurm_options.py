"""A Slurm option is declared once, on its field: every list is derived from the declarations (issue 25, item 3)."""

import dataclasses

from hpc_train.config import JobSpec, SlurmConfig
from hpc_train.config.slurm_options import (Flag, Sbatch, cli_flags, ignored_locally, managed_sbatch_keys, option,
                                            sbatch_options, sbatch_text, sbatch_text_fields)
from hpc_train.config.validate import MANAGED_SBATCH_KEYS, SBATCH_TEXT_FIELDS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
    """A test-local schema: adding an option is this one declaration."""

    nodes: int = option(1, sbatch=Sbatch("nodes"), flag=Flag("--nodes", "-N"))
    reservation: str | None = option(None, sbatch=Sbatch("reservation"), local=False, flag=Flag("--reservation"))
    cores: int = option(2, sbatch=Sbatch("cpus-per-task", value=lambda s: s.cores * 2, manages=("cpus-per-task", "c")))
    quiet: bool = option(False, sbatch=Sbatch("quiet", flag=True), local="requeue")
    note: str = "x"


def test_one_declaration_reaches_every_list():
    section = Section(reservation="maint", quiet=True)
    assert [sbatch_text(n, d, section) for n, d in sbatch_options(Section)] == [
        "--nodes=1", "--reservation=maint", "--cpus-per-task=4", "--quiet"]
    assert managed_sbatch_keys(Section, "slurm") == {
        "nodes": "slurm.nodes (--nodes)", "reservation": "slurm.reservation (--reservation)",
        "cpus-per-task": "slurm.cores", "c": "slurm.cores", "quiet": "slurm.quiet"}
    assert sbatch_text_fields(Section) == ("nodes", "reservation", "cores", "quiet")
    assert ignored_locally(section, relaunches=False) == ["reservation", "quiet"]
    assert ignored_locally(section, relaunches=True) == ["reservation"]
    assert [(key, flag.name) for key, _f, flag in cli_flags(Section, "slurm")] == [
        ("slurm.nodes", "--nodes"), ("slurm.reservation", "--reservation")]


def test_the_real_lists_are_what_the_fields_declare():
    declared = {key for _name, d in sbatch_options(SlurmConfig) for key in d.keys()}
    assert declared | {"job-name"} <= set(MANAGED_SBATCH_KEYS)
    assert {"partition", "account", "qos", "constraint", "time", "gres_name"} <= set(SBATCH_TEXT_FIELDS)
    local_only = {f.name for f in dataclasses.fields(SlurmConfig) if f.metadata.get("local", True) is not True}
    assert {"modules", "venv", "partition", "extra_sbatch", "requeue", "max_requeues"} <= local_only
    assert "env" not in local_only and "hang_timeout_s" not in local_only
    from hpc_train.cli.options import FLAG_KEYS

    assert FLAG_KEYS == {flag.name.lstrip("-").replace("-", "_"): key
                         for key, _f, flag in [*cli_flags(SlurmConfig, "slurm"), *cli_flags(JobSpec)]}
    assert FLAG_KEYS["gpus"] == "slurm.gpus_per_node" and FLAG_KEYS["pack"] == "slurm.pack"


def test_a_refused_extra_sbatch_key_names_everything_that_sets_it():
    # The advice a field declares for one of its keys (the review of issue 25 found the derived messages had lost it).
    from hpc_train.config.validate import MANAGED_SBATCH_KEYS

    assert MANAGED_SBATCH_KEYS["gres"] == "slurm.gpus_per_node (--gpus) with slurm.gpu_flag=gres and slurm.gres_name"
    assert MANAGED_SBATCH_KEYS["signal"] == "slurm.signal and slurm.signal_delay_s"
    assert MANAGED_SBATCH_KEYS["gpus"] == "slurm.gpus_per_node (--gpus)"
