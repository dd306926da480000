"""The entrypoint end to end in one process: bad input, devices, strategies, two-stage, checkpoints,
the submitit callable. (Multi-process behaviour: test_distributed.py and test_resume.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from hpc_train.runs import rundir

torch = pytest.importorskip("torch")

from hpc_train.config import dump_yaml  # noqa: E402
from hpc_train.train import launch  # noqa: E402
from hpc_train.train.__main__ import main  # noqa: E402
from hpc_train.train.state import checkpoint as ckpt  # noqa: E402

from .helpers import (DIGITS_QUICK, PYTHON, REPO, clean_env, deep_update, digits_lt_counts, make_spec,  # noqa: E402
                      steps_per_epoch, write_job)


def _one_or_two_lines_no_traceback(err: str) -> None:
    assert "Traceback" not in err, err
    assert 1 <= len(err.strip().splitlines()) <= 2, err


@pytest.mark.parametrize("sets, expected", [
    (["train.loss.name=nope"], "train.loss.name: must be one of"),
    (["train.model.name=vgg"], "train.model.name: must be one of"),
    (["train.data.name=mnist"], "train.data.name: must be one of"),
    (["train.batch_size=63"], "does not split across 2 ranks"),
    (["train.optimizer=adam"], "unknown key 'train.optimizer'"),
    (["train.loss.label_smoothing=0.1"], "label_smoothing applies to ce only"),
    (["train.two_stage.tau_norm=true"], "never on test"),
    (["train.loss.name=ldam"], "presumes the cosine classifier's logits in [-1, 1]"),
    (["train.data.color_jitter=-0.1"], "color_jitter must be >= 0"),
    (["train.cuda_graphs=on"], "train.cuda_graphs=on but the device is the CPU"),
    (["train.cuda_graphs=sometimes"], "train.cuda_graphs: must be one of"),
    (["train.checkpoint_every_s=0"], "train.checkpoint_every_s must be > 0"),
    (["train.data.name=list", "train.data.train_list=a.txt", "train.data.test_list=b.txt",
      "train.data.root=/nonexistent"], "list file not found: /nonexistent/a.txt"),
])
def test_bad_input_exits_2_with_a_clear_message(sets, expected, capsys, restore_signals):
    args = ["jobs/digits_lt_demo.yaml", "--dry-run"]
    for item in sets:
        args += ["--set", item]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert expected in err
    _one_or_two_lines_no_traceback(err)


def test_bad_input_exit_code_of_the_real_process(tmp_path):
    proc = subprocess.run([PYTHON, "-m", "hpc_train.train", "jobs/digits_lt_demo.yaml", "--set", "train.loss.name=x"],
                          cwd=REPO, env=clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    _one_or_two_lines_no_traceback(proc.stderr)
    missing = subprocess.run([PYTHON, "-m", "hpc_train.train", str(tmp_path / "no.yaml")], cwd=REPO,
                             env=clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "job file not found" in missing.stderr


@pytest.mark.parametrize("sets, why", [
    (["train.device=cuda"], "train.device=cuda"),
    (["slurm.gpus_per_node=1"], "slurm.gpus_per_node=1"),  # device auto + GPUs requested: never a CPU fallback
])
def test_cuda_without_cuda_exits_2(sets, why, tmp_path, capsys, restore_signals, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the missing-CUDA path, on any host
    job = write_job(tmp_path / "job.yaml", DIGITS_QUICK, tasks=1)
    args = [str(job), "--run-dir", str(tmp_path / "run")]
    for item in sets:
        args += ["--set", item]
    args += ["--set", "train.device=" + ("cuda" if "cuda" in sets[0] else "auto")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert why in err and "CUDA is not available" in err and "train.device=cpu" in err
    _one_or_two_lines_no_traceback(err)


def _final_state(run_dir: Path) -> dict:
    state, _ = ckpt.load_latest(run_dir)
    return state


def test_strategy_dp_cpu_form_trains_like_none(tmp_path):
    # DataParallel on a machine without GPUs calls the module directly: same weights as strategy none,
    # and checkpoints carry the bare model's keys (no "module." prefix), so they are interchangeable.
    results = {}
    for strategy in ("none", "dp"):
        spec = make_spec(deep_update(DIGITS_QUICK, strategy=strategy, epochs=2))
        outcome = launch.run(spec, run_dir=str(tmp_path / strategy))
        assert outcome.exit_code == 0
        results[strategy] = _final_state(tmp_path / strategy)
    a, b = results["none"]["model"], results["dp"]["model"]
    assert a.keys() == b.keys() and not any(k.startswith("module.") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert results["dp"]["global_step"] == 2 * steps_per_epoch(sum(digits_lt_counts(20)), 32)


def test_run_directory_outputs(tmp_path, capsys):
    spec = make_spec(deep_update(DIGITS_QUICK, epochs=3, eval_every_epochs=2, loss={"name": "ce", "posthoc_tau": 1.0}))
    run_dir = tmp_path / "run"
    outcome = launch.run(spec, run_dir=str(run_dir))
    assert outcome.exit_code == 0
    out = capsys.readouterr().out
    assert "many" in out and "medium" in out and "few" in out and "post-hoc tau=1" in out
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"record": ' not in line]
    assert [r["epoch"] for r in records] == [2, 3]  # every 2 epochs, and always after the last
    counts = digits_lt_counts(20)
    for r in records:
        assert r["count"] == [50] * 10 and len(r["per_class"]) == 10
        assert r["top1"] == pytest.approx(sum(r["correct"]) / 500)
        assert r["balanced"] == pytest.approx(sum(r["per_class"]) / 10)
        many = [a for a, n in zip(r["per_class"], counts) if n > 100]
        assert r["many"] == pytest.approx(sum(many) / len(many))
        assert set(r["posthoc"]) >= {"tau", "top1", "balanced", "many", "medium", "few", "per_class"}
    summary = json.loads((run_dir / "summary.json").read_text())
    # The end line of rank 0, and the same figures in the summary.
    end = re.search(r"^3 epochs in ([\d.]+) s \(train ([\d,]+) img/s, eval ([\d,]+) img/s, set-up ([\d.]+) s\)$", out,
                    re.M)
    timing = summary["timing"]
    assert end and summary["end_line"] == end.group(0), out[-500:]
    # The line shows summary.json's wall time to one decimal: compared as text, since a wall time of x.x5 s
    # rounds half to even (1.25 -> "1.2"), 0.05 away plus float error, which a tolerance of 0.05 fails (it did).
    assert end.group(1) == f"{timing['wall_s']:.1f}" and timing["epochs"] == 3
    assert int(end.group(2).replace(",", "")) == round(timing["train_images_per_s"])
    assert int(end.group(3).replace(",", "")) == round(timing["eval_images_per_s"])
    assert timing["train_images"] == 3 * sum(counts) and timing["eval_images"] == 2 * 500
    assert 0 < timing["train_s"] + timing["eval_s"] <= timing["wall_s"] and timing["setup_s"] > 0
    assert timing["cuda_graphs"]["on"] is False and "the device is cpu" in timing["cuda_graphs"]["reason"]
    # The last epoch is the headline; without a held-out split no "best" exists, the best test top-1 only as
    # best_on_test (a choice made on the test split), in the summary and in the end-of-run table.
    assert summary["last"]["top1"] == records[-1]["top1"] and summary["best"] is None
    assert summary["best_on_test"]["top1"] == max(r["top1"] for r in records)
    assert summary["last"]["ece"] == records[-1]["ece"] and 0 <= records[-1]["ece"] <= 1
    rows = [line.split("  ")[0] for line in summary["table"].splitlines() if line[:1].isalpha()][1:]
    assert rows == ["last (ep 3)", f"best_on_test (ep {summary['best_on_test']['epoch']})", "post-hoc tau=1"], rows
    assert summary["train_counts"] == counts
    assert json.loads((run_dir / "class_counts.json").read_text())["train_counts"] == counts
    rank = json.loads((run_dir / "ranks" / "rank-0.json").read_text())
    assert rank["rank"] == 0 and rank["world_size"] == 1 and rank["source"] == "single" and rank["pid"] == os.getpid()
    assert {"local_rank", "node_rank", "local_world_size", "master_addr", "master_port", "hostname",
            "CUDA_VISIBLE_DEVICES"} <= set(rank)
    assert (run_dir / "job.yaml").read_text() == dump_yaml(spec)
    assert (run_dir / "per_class_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rundir.read_state(run_dir).state == "completed"
    assert len(ckpt.list_checkpoints(run_dir)) == spec.train.keep_checkpoints


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    spec = make_spec(deep_update(DIGITS_QUICK, epochs=2))
    run_dir = tmp_path / "run"
    assert launch.run(spec, run_dir=str(run_dir)).exit_code == 0
    newest, previous = ckpt.list_checkpoints(run_dir)
    good = torch.load(previous, weights_only=True)  # RNG states are tensors: weights_only loads them
    newest.write_bytes(newest.read_bytes()[:2000])   # a truncated file, as a full disk leaves it
    import logging

    caplog.set_level(logging.WARNING, logger="hpc_train")
    logging.getLogger("hpc_train").propagate = True  # launch.run set it to False; let caplog see it
    state, path = ckpt.load_latest(run_dir)
    assert path == previous and state["global_step"] == good["global_step"]
    assert any("unreadable" in r.getMessage() and newest.name in r.getMessage() for r in caplog.records)
    # A new start resumes from it (one epoch back) and trains the last epoch again.
    assert launch.run(spec, run_dir=str(run_dir)).exit_code == 0
    assert _final_state(run_dir)["global_step"] == 2 * steps_per_epoch(sum(digits_lt_counts(20)), 32)


def _tau_norm_by_hand(spec, model_state: dict, tau: float) -> list[int]:
    """Per-class correct test predictions of ``model_state``'s classifier τ-normalised (bias dropped), on
    that state's own features and BatchNorm statistics: classifier-balancing's tau_norm, written out."""
    from hpc_train.train.data import datasets
    from hpc_train.train.data.pipeline import DeviceImages
    from hpc_train.train.model.models import init_model

    data = datasets.load(spec.train.data)
    model = init_model(spec.train, data)
    model.load_state_dict(model_state)
    model.eval()
    images = DeviceImages(data.test, torch.device("cpu"), mean=data.mean, std=data.std, crop_padding=0,
                          flip=False, channels_last=False)
    x, y = images.plain(torch.arange(len(data.test)))
    w = model_state["classifier.weight"]
    with torch.no_grad():
        pred = (model.backbone(x) @ (w / w.norm(dim=1, keepdim=True).pow(tau)).t()).argmax(1)
    return torch.bincount(y[pred == y], minlength=data.num_classes).tolist()


def test_crt_and_tau_norm_start_from_the_best_epoch_on_the_held_out_split(tmp_path):
    # Three epochs of joint training, one of cRT (frozen features, fresh classifier, class-aware sampling,
    # BatchNorm statistics re-estimated), then τ-normalisation of the *stage-1* classifier with the stage-1
    # statistics, τ chosen on a held-out 20% of the training set. Stage 1 is the best epoch on the held-out
    # split (classifier-balancing's stage 2 loads stage 1's best checkpoint on val), here epoch 2 of 3, kept as
    # its own snapshot although the checkpoint cadence (every 100 epochs) writes no checkpoint there.
    spec = make_spec(deep_update(DIGITS_QUICK, epochs=3, seed=0, keep_checkpoints=10, checkpoint_every_epochs=100,
                                 optim={"lr": 0.2, "weight_decay": 5e-4},
                                 data={"name": "digits-lt", "imbalance_factor": 20, "val_fraction": 0.2},
                                 two_stage={"crt_epochs": 1, "crt_lr": 0.1, "tau_norm": True}))
    run_dir = tmp_path / "run"
    assert launch.run(spec, run_dir=str(run_dir)).exit_code == 0
    states = {torch.load(p, weights_only=True)["epoch"]: torch.load(p, weights_only=True)
              for p in ckpt.list_checkpoints(run_dir)}
    assert sorted(states) == [3, 4]  # the ends of the stages only
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"record": ' not in line]
    assert [r["phase"] for r in records] == ["main", "main", "main", "crt", "tau_norm"]
    best_epoch = max(records[:3], key=lambda r: r["val"]["balanced"])["epoch"]
    assert best_epoch == 2, "this setting was chosen so that the best held-out epoch is not the last (seed 0, lr 0.2)"
    snapshot = ckpt.load_best_held_out(run_dir)
    assert snapshot["record"]["epoch"] == 2 and snapshot["record"]["val"] == records[1]["val"]
    best, end_of_stage1, after_crt = snapshot["model"], states[3]["model"], states[4]["model"]
    assert states[3]["phase"] == "main" and states[4]["phase"] == "crt"
    weights = [k for k in best if k.startswith("backbone.") and k.endswith(("weight", "bias"))]
    stats = [k for k in best if k.startswith("backbone.") and k.endswith(("running_mean", "running_var"))]
    assert weights and all(torch.equal(best[k], after_crt[k]) for k in weights)  # frozen features, of the best epoch
    assert not all(torch.equal(end_of_stage1[k], after_crt[k]) for k in weights)  # not the end of stage 1
    assert stats and all(not torch.equal(best[k], after_crt[k]) for k in stats)  # re-estimated in cRT
    assert not torch.equal(best["classifier.weight"], after_crt["classifier.weight"])
    stage1 = states[4]["stage1"]  # kept in cRT's checkpoints, so a resumed cRT still has it
    assert torch.equal(stage1["classifier"]["weight"], best["classifier.weight"])
    assert all(torch.equal(stage1["backbone_buffers"][k[len("backbone."):]], best[k]) for k in stats)

    tau = records[-1]
    grid = [round(0.1 * i, 1) for i in range(21)]
    assert tau["tau"] in grid
    assert tau["tau"] == max(grid, key=lambda t: (tau["val_balanced"][str(t)], -t))  # best on held-out, ties small
    assert tau["count"] == [50] * 10  # reported on the test split, chosen on the held-out split
    assert tau["correct"] == _tau_norm_by_hand(spec, best, tau["tau"])  # the best stage-1 model, normalised
    assert tau["correct"] != _tau_norm_by_hand(spec, after_crt, tau["tau"])  # not the cRT classifier

    # With a held-out split the best epoch is the best held-out balanced accuracy, reported on test.
    summary = json.loads((run_dir / "summary.json").read_text())
    evaluated = records[:-1]
    chosen = max(evaluated, key=lambda r: r["val"]["balanced"])  # max() keeps the first of equals
    assert summary["best"]["epoch"] == chosen["epoch"] and summary["best"]["top1"] == chosen["top1"]
    assert summary["best"]["val"] == chosen["val"] and summary["last"]["epoch"] == 4


def test_crt_with_frozen_batchnorm_statistics(tmp_path):
    spec = make_spec(deep_update(DIGITS_QUICK, epochs=1, keep_checkpoints=10,
                                 two_stage={"crt_epochs": 1, "crt_lr": 0.1, "crt_bn": "frozen"}))
    run_dir = tmp_path / "run"
    assert launch.run(spec, run_dir=str(run_dir)).exit_code == 0
    states = {torch.load(p, weights_only=True)["epoch"]: torch.load(p, weights_only=True)
              for p in ckpt.list_checkpoints(run_dir)}
    backbone = [k for k in states[1]["model"] if k.startswith("backbone.")]
    assert backbone and all(torch.equal(states[1]["model"][k], states[2]["model"][k]) for k in backbone)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"record": ' not in line]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "val" not in records[0] and summary["best_on_test"]["top1"] == max(r["top1"] for r in records)  # no held-out


def test_train_job_callable_returns_a_summary(tmp_path):
    from hpc_train.rank.callable import TrainJob

    spec = make_spec(deep_update(DIGITS_QUICK, epochs=1))
    result = TrainJob(dump_yaml(spec), str(tmp_path / "run"))()
    assert result["global_step"] == steps_per_epoch(sum(digits_lt_counts(20)), 32)
    assert 0 < result["last"]["top1"] <= 1 and "per_class" not in result["last"]
    assert "many" in result["table"]
    job_file = tmp_path / "job.yaml"
    job_file.write_text(dump_yaml(spec))
    again = TrainJob(str(job_file), str(tmp_path / "run"))()  # a path works too; the run is already done
    assert again["global_step"] == result["global_step"]


FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
exit 0
"""


@pytest.mark.parametrize("restart_count, expect_requeue", [("0", True), ("3", False)])
def test_preempted_train_job_requeues_and_does_not_return(tmp_path, restart_count, expect_requeue):
    # Slurm cannot run here, so `scontrol` is a stand-in that records its arguments; the signal, the
    # checkpoint, the decision and the exit are real. (The Slurm suite requeues for real.)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL.format(log=log))
    (bin_dir / "scontrol").chmod(0o755)
    spec = make_spec(deep_update(DIGITS_QUICK, epochs=2, preempt_check_every_steps=3))
    run_dir = tmp_path / "run"
    code = (
        "import os, signal, sys\n"
        "from hpc_train.rank import preempt\n"
        "from hpc_train.train.callable import TrainJob\n"
        "preempt.install()\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"  # arrives before training starts
        f"result = TrainJob(open({str(tmp_path / 'job.yaml')!r}).read(), {str(run_dir)!r})()\n"
        "print('RETURNED', result)\n"
    )
    (tmp_path / "job.yaml").write_text(dump_yaml(spec))
    env = clean_env(tmp_path, SLURM_JOB_ID="1234", SLURM_ARRAY_JOB_ID="1200", SLURM_ARRAY_TASK_ID="3",
                    SLURM_RESTART_COUNT=restart_count, PATH=f"{bin_dir}:{os.environ['PATH']}")
    proc = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert "RETURNED" not in proc.stdout  # submitit must record no result for this instance
    state = torch.load(ckpt.list_checkpoints(run_dir)[0], weights_only=True)
    assert state["global_step"] == 3 and state["epoch"] == 0 and state["step_in_epoch"] == 3
    status = {"state": rundir.read_state(run_dir).state}
    if expect_requeue:
        assert proc.returncode == 0, proc.stderr
        assert log.read_text().split() == ["requeue", "1200_3"]  # the array-aware id
        assert status["state"] == "requeued"
    else:
        assert proc.returncode == 75, proc.stderr
        assert not log.exists()
        assert status["state"] == "preempted" and "max_requeues" in proc.stderr
        assert "hpc-train submit --resume" in proc.stdout + proc.stderr


def test_world_size_mismatch_fails_fast_instead_of_hanging(tmp_path, monkeypatch, capsys, restore_signals):
    job = write_job(tmp_path / "job.yaml", DIGITS_QUICK, tasks=1)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    assert main([str(job), "--run-dir", str(tmp_path / "run")]) == 2  # rank 1 never comes: no rendezvous
    err = capsys.readouterr().err
    assert "expects 1 ranks but the launcher started 2" in err
    _one_or_two_lines_no_traceback(err)


def test_submitit_local_executor_runs_the_callable_on_two_ranks(tmp_path, monkeypatch):
    import submitit

    from hpc_train.rank.callable import TrainJob

    from .helpers import free_port

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    spec = make_spec(deep_update(DIGITS_QUICK, epochs=1), tasks=2)
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="local")
    executor.update_parameters(nodes=1, tasks_per_node=2, timeout_min=10)
    job = executor.submit(TrainJob(dump_yaml(spec), str(tmp_path / "run")))
    result = job.results()[0]  # rank 0's summary
    assert result["world_size"] == 2
    assert result["global_step"] == steps_per_epoch(sum(digits_lt_counts(20)), 32)
    ranks = [json.loads((tmp_path / "run" / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(x["rank"], x["local_rank"], x["source"]) for x in ranks] == [(0, 0, "submitit-local"),
                                                                          (1, 1, "submitit-local")]


def test_tf32_uses_one_precision_api_and_the_reproduction_recipes_turn_it_off():
    from hpc_train.config import resolve_job
    from hpc_train.train.launch import set_tf32

    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    before = [f.fp32_precision for f in flags]
    try:
        set_tf32(False)
        assert [f.fp32_precision for f in flags] == ["ieee", "ieee"]
        set_tf32(True)
        assert [f.fp32_precision for f in flags] == ["tf32", "tf32"]
    finally:
        for f, value in zip(flags, before):
            f.fp32_precision = value
    for recipe in sorted((REPO / "jobs").glob("cifar*.yaml")):  # fp32 as the references ran
        assert resolve_job(recipe)[0].train.tf32 is False, recipe.name


def test_run_directory_choice(tmp_path, monkeypatch):
    spec = make_spec(DIGITS_QUICK, name="demo", runs_dir=str(tmp_path / "runs"))
    assert launch.choose_run_dir(spec, str(tmp_path / "explicit")) == tmp_path / "explicit"
    default = launch.choose_run_dir(spec, None)
    assert default.parent == tmp_path / "runs" / "demo" and default.name.startswith("local-")
    monkeypatch.setenv("HPC_TRAIN_RUN_DIR", str(tmp_path / "from-sbatch"))
    assert launch.choose_run_dir(spec, None) == tmp_path / "from-sbatch"
    assert launch.choose_run_dir(spec, str(tmp_path / "explicit")) == tmp_path / "explicit"  # the flag wins


def test_requeue_decision_rules():
    from hpc_train.rank.preempt import decide_requeue, requeue_job_id

    slurm = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}
    assert requeue_job_id(slurm) == "77"
    assert requeue_job_id({**slurm, "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "4"}) == "70_4"
    assert requeue_job_id({}) is None
    kw = dict(requeue_enabled=True, max_requeues=3, by_requeue_signal=True, scontrol="/bin/true")
    assert decide_requeue(environ=slurm, **kw).requeue
    assert not decide_requeue(environ={**slurm, "SLURM_RESTART_COUNT": "3"}, **kw).requeue
    assert not decide_requeue(environ={}, **kw).requeue  # not under Slurm
    assert not decide_requeue(environ=slurm, **{**kw, "requeue_enabled": False}).requeue
    assert not decide_requeue(environ=slurm, **{**kw, "by_requeue_signal": False}).requeue  # SIGTERM / scancel
