"""The README and --help, as typed (issue 19): `submit --dry-run` without Slurm prints the script and says the
verdict was skipped (exit 0); a local run that asks for a GPU this machine lacks is refused before any rank
starts; --max-parallel's help says what --pack does locally; simulate lists only options that change it."""

import time

from tests.cli_helpers import assert_refused, cli, tree


def test_dry_run_without_slurm_prints_the_script_and_skips_the_verdict(tmp_path, stub_slurm):
    for tool in stub_slurm.TOOLS:
        stub_slurm.remove(tool)
    for args in (["--nodes", "4", "--gpus", "8", "cifar100_lt_bs"], ["--cluster", "slurm"]):
        result = cli("submit", *args, "--dry-run", cwd=tmp_path, env=stub_slurm.env())
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("#!/bin/bash") and "\nsrun " in result.stdout
        assert result.stderr.strip().splitlines()[-1] == "no Slurm here: sbatch --test-only skipped"
    assert "#SBATCH --nodes=4" in cli("submit", "--nodes", "4", "--gpus", "8", "cifar100_lt_bs", "--dry-run",
                                      cwd=tmp_path, env=stub_slurm.env()).stdout
    assert tree(tmp_path) == []
    # A job this machine can run still shows its local plan.
    local = cli("submit", "--dry-run", cwd=tmp_path, env=stub_slurm.env())
    assert local.returncode == 0 and "RANK=0 LOCAL_RANK=0" in local.stdout


def test_a_local_gpu_job_without_a_gpu_is_refused_before_any_rank_starts(tmp_path, stub_slurm):
    # The README's sweep example with --gpus 1 failed only after the ranks' start-up (27 s there).
    start = time.monotonic()
    for args in (["--gpus", "1", "--sweep", "train.seed=0,1", "--pack", "2"], ["--set", "train.device=cuda"]):
        for dry in ([], ["--dry-run"]):
            result = cli("submit", "--cluster", "local", "digits_lt_demo", *args, *dry, "--wait", cwd=tmp_path,
                         env=stub_slurm.env())
            assert_refused(result, "but this machine has 0; run it locally with --gpus 0")
    assert time.monotonic() - start < 30 and tree(tmp_path) == []


def test_help_says_what_the_options_do():
    assert "one at a time, or K at a time with --pack K" in " ".join(cli("submit", "--help").stdout.split())
    shown = cli("simulate", "--help").stdout
    for option in ("--nodes", "--gpus", "--tasks-per-node", "--set", "--nodelist", "--job-id", "--json"):
        assert option in shown
    for option in ("--time", "--partition", "--account", "--name", "--runs-dir", "--epochs", "--launcher"):
        assert option not in shown, option
    assert_refused(cli("simulate", "--time", "01:00:00"), "No such option '--time'")
