"""Job configuration: layering, schema checks and the messages users see."""

import textwrap

import pytest

from hpc_train import config
from hpc_train.config import ConfigError, JobSpec, SiteConfig, resolve_job, time_to_minutes


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def no_site():
    return SiteConfig(path=None, defaults={}, template_dirs=())


@pytest.mark.parametrize(
    "text,minutes",
    [("30", 30), ("30:30", 31), ("02:00:00", 120), ("1-00", 1440), ("1-02:30", 1590), ("0-00:00:59", 1),
     ("2-00:00:00", 2880), ("", None), ("1:2:3:4", None), ("abc", None), ("1-", None), ("-5", None), ("1.5", None)],
)
def test_time_formats(text, minutes):
    """Slurm's --time forms in minutes (rounded up, as Slurm does); anything else is a ValueError."""
    if minutes is None:
        with pytest.raises(ValueError):
            time_to_minutes(text)
    else:
        assert time_to_minutes(text) == minutes


def test_precedence_site_job_set_flags(tmp_path):
    site = SiteConfig(path=tmp_path / "site.yaml", template_dirs=(),
                      defaults={"slurm": {"partition": "site-part", "account": "site-acct", "qos": "site-qos",
                                          "env": {"NCCL_IB_HCA": "mlx5_0", "A": "site"}}})
    job = write(tmp_path / "job.yaml", """
        name: prec
        slurm:
          account: job-acct
          qos: job-qos
          time: "2:00:00"
          env: {A: job}
        """)
    spec, sources = resolve_job(job, site=site, sets=["slurm.qos=set-qos", "slurm.time=03:00:00"],
                                flags={"slurm.time": "04:00:00", "slurm.nodes": None})
    s = spec.slurm
    assert (s.partition, s.account, s.qos, s.time) == ("site-part", "job-acct", "set-qos", "04:00:00")
    assert dict(s.env) == {"NCCL_IB_HCA": "mlx5_0", "A": "job"}  # mappings merge key by key
    assert s.nodes == 1  # a flag left unset changes nothing
    assert sources.job_file == job and sources.site_file == tmp_path / "site.yaml"


def test_time_like_values_stay_text(tmp_path):
    # YAML 1.1 would read 1:30:00 as the integer 5400 (base 60).
    job = write(tmp_path / "job.yaml", "slurm:\n  time: 1:30:00\n")
    spec, _ = resolve_job(job, site=no_site())
    assert spec.slurm.time == "1:30:00" and spec.slurm.time_min == 90


def test_set_values_are_yaml_scalars(tmp_path):
    spec, _ = resolve_job(None, site=no_site(), sets=[
        "train.epochs=7", "train.optim.lr=2e-4", "slurm.exclusive=true", "slurm.modules=[cuda/12.4, nccl]",
        "slurm.env.NCCL_DEBUG=INFO", "name=my run"])
    assert spec.train.epochs == 7 and spec.train.optim.lr == pytest.approx(2e-4)
    assert spec.slurm.exclusive is True and spec.slurm.modules == ("cuda/12.4", "nccl")
    assert spec.slurm.env["NCCL_DEBUG"] == "INFO" and spec.name == "my run"


def test_gpus_flag_implies_one_rank_per_gpu():
    # The default job runs 2 CPU ranks; `--gpus 8` means 8 ranks per node, as a user expects.
    spec, _ = resolve_job(None, site=no_site(), flags={"slurm.nodes": 4, "slurm.gpus_per_node": 8})
    assert (spec.slurm.ranks_per_node, spec.slurm.world_size) == (8, 32)


def test_torchrun_is_one_task_per_node():
    spec, _ = resolve_job(None, site=no_site(), flags={"slurm.gpus_per_node": 4, "slurm.launcher": "torchrun"},
                          sets=["slurm.cpus_per_task=6"])
    s = spec.slurm
    assert (s.sbatch_tasks_per_node, s.sbatch_cpus_per_task, s.ranks_per_node) == (1, 24, 4)


@pytest.mark.parametrize(
    "text,message",
    [
        ("slurmm: {}\n", "unknown key 'slurmm'; valid keys at the top level: name, runs_dir, slurm, train"),
        ("slurm:\n  gpus: 4\n", "unknown key 'slurm.gpus'; valid keys under 'slurm': nodes, gpus_per_node"),
        ("train:\n  data:\n    nmae: x\n", "unknown key 'train.data.nmae'; valid keys under 'train.data': name"),
        ("slurm:\n  nodes: two\n", "slurm.nodes: must be an integer, got 'two'"),
        ("slurm:\n  nodes: 0\n", "slurm.nodes must be between 1 and 100,000, got 0"),
        ("slurm:\n  gpus_per_node: -1\n", "slurm.gpus_per_node must be between 0 and 1024, got -1"),
        ("slurm:\n  launcher: mpirun\n", "slurm.launcher: must be one of 'srun', 'torchrun', got 'mpirun'"),
        ("slurm:\n  time: soon\n", "slurm.time: 'soon' is not a Slurm time"),
        ("slurm:\n  modules: cuda\n", "slurm.modules: must be a list"),
        ("slurm:\n  exclusive: 1\n", "slurm.exclusive: must be true or false"),
        ("slurm:\n  env: {1BAD: x}\n", "'1BAD' is not a valid environment variable name"),
        ("slurm:\n  partition: \"a\\nb\"\n", "contains a newline"),
        ("slurm:\n  signal_delay_s: 7200\n  time: '01:00:00'\n", "shorter than the time limit"),
        ("name: a/b\n", "cannot be a job name"),
        ("- just\n- a list\n", "must be a YAML mapping"),
    ],
)
def test_bad_job_files(tmp_path, text, message):
    job = write(tmp_path / "job.yaml", text)
    with pytest.raises(ConfigError) as info:
        resolve_job(job, site=no_site())
    assert message in str(info.value)
    assert "\n" not in str(info.value).strip()  # one line


@pytest.mark.parametrize("sets,message", [
    (["train.optim.sam_tail_below=20"], "sam_tail_below chooses ImbSAM's tail classes for SAM; set train.optim.sam_rho"),
    (["train.optim.sam_rho=0.5", "train.amp=fp16", "train.device=cuda", "slurm.gpus_per_node=1",
      "slurm.tasks_per_node=1"],
     "train.optim.sam_rho with amp fp16"),
    (["train.mixup_alpha=1", "train.data.name=imagefolder"], "mixup_alpha mixes images of the in-memory data sets"),
    (["train.mixup_alpha=1", "train.optim.sam_rho=0.05", "train.optim.sam_tail_below=20"], "use one of them"),
    (["train.mixup_alpha=1", "train.strategy=dp", "slurm.tasks_per_node=1"], "need strategy ddp or none"),
    (["train.two_stage.crt_max_norm=0.1"], "train.two_stage.crt_max_norm applies to stage 2"),
    (["train.two_stage.crt_reinit=false"], "train.two_stage.crt_reinit applies to stage 2"),
    (["train.two_stage.crt_loss.name=label_aware_smoothing"], "train.two_stage.crt_loss applies to stage 2"),
    (["train.two_stage.crt_epochs=2", "train.two_stage.crt_loss.name=nope"], "train.two_stage.crt_loss.name: must be"),
    (["train.two_stage.crt_epochs=2", "train.two_stage.crt_loss.name=ldam"], "crt_loss.name=ldam multiplies logits"),
    (["train.two_stage.crt_epochs=2", "train.two_stage.crt_loss.drw_epoch=1"], "stage 2 has no deferred re-weighting"),
    (["train.two_stage.crt_epochs=2", "train.two_stage.crt_loss.posthoc_tau=1"], "post-hoc adjustment is evaluated"),
    (["train.two_stage.crt_epochs=2", "train.two_stage.crt_max_norm=0.1", "train.model.classifier=cosine",
      "train.loss.name=ldam"], "crt_max_norm caps the norms of a linear classifier's"),
    (["train.loss.name=label_aware_smoothing", "train.loss.smooth_head=0.1", "train.loss.smooth_tail=0.3"],
     "smooth_head=0.1 is below smooth_tail=0.3"),
    (["train.loss.normalise=sum"], "train.loss.normalise: must be one of 'weight_sum', 'batch_size'"),
    (["train.two_stage.crt_max_norm=2"], "train.two_stage.crt_max_norm must be between 0 and 1"),
])
def test_method_keys_are_refused_where_they_cannot_apply(sets, message):
    with pytest.raises(ConfigError) as info:
        resolve_job(None, site=no_site(), sets=sets)
    assert message in str(info.value) and "\n" not in str(info.value).strip()


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    job = write(tmp_path / "job.yaml", "name: x\nslurm:\n  nodes: 2\n  modules: [a, b\n")
    with pytest.raises(ConfigError, match=r"job\.yaml:5:1: YAML syntax error"):
        resolve_job(job, site=no_site())


def test_missing_job_file(tmp_path):
    with pytest.raises(ConfigError, match="job file not found: .*nope.yaml"):
        resolve_job(tmp_path / "nope.yaml", site=no_site())


@pytest.mark.parametrize(
    "item,message",
    [("slurm.bogus=1", "unknown key 'slurm.bogus'"), ("noequals", "expected KEY=VALUE"),
     ("slurm.nodes.x=1", "slurm.nodes is an integer, it has no sub-keys"),
     ("slurm.env.A.B=1", "slurm.env takes one more key")],
)
def test_bad_set(item, message):
    with pytest.raises(ConfigError, match=message):
        resolve_job(None, site=no_site(), sets=[item])


def test_site_file_from_env(tmp_path, monkeypatch):
    templates = tmp_path / "tpl"
    templates.mkdir()
    site = write(tmp_path / "site.yaml", """
        template_dirs: [tpl]
        slurm:
          partition: gpu
          gpu_flag: gres
        """)
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    loaded = config.load_site()
    assert loaded.path == site and loaded.template_dirs == (templates,)
    spec, sources = resolve_job(None)
    assert spec.slurm.partition == "gpu" and spec.slurm.gpu_flag == "gres"
    assert sources.template_dirs == (templates,)


def test_site_file_unknown_key_names_the_site_file(tmp_path, monkeypatch):
    site = write(tmp_path / "site.yaml", "slurm:\n  partitoin: gpu\n")
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    with pytest.raises(ConfigError, match=r"site file .*site.yaml: unknown key 'slurm.partitoin'"):
        config.load_site()


def test_missing_explicit_site_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_SITE", str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="site file not found"):
        config.load_site()


def test_resolved_yaml_round_trips(tmp_path):
    spec, _ = resolve_job(None, site=no_site(), sets=["slurm.env.X=a b", "slurm.modules=[m1]", "slurm.time=1:30:00",
                                                      "slurm.container={image: /i.sif, binds: [/data]}"])
    again = config.spec_from_yaml_text(config.dump_yaml(spec), "round trip")
    assert again == spec
    assert isinstance(again, JobSpec)


def test_every_shipped_job_file_is_valid():
    from hpc_train.resources import jobs_dir

    paths = sorted(jobs_dir().glob("*.yaml"))
    assert paths, "no example jobs shipped"
    for path in paths:
        spec, _ = resolve_job(path, site=no_site())
        assert spec.name


BATCH_MEAN_LOSSES = {"focal", "sigmoid_focal", "softmax_bce"}
"""Losses whose normaliser is always the batch size (their references' batch means; ``normalise`` does not apply)."""


def test_every_weighted_shipped_recipe_names_its_normaliser():
    # Issue 20 B.4: Σw (LDAM-DRW's weighted CE) and the batch size (Cui et al.) are two published forms; a
    # recipe with class weights says which one it trains with, not the default by silence.
    import yaml

    from hpc_train.resources import jobs_dir

    unnamed, weighted = [], 0
    for path in sorted(jobs_dir().glob("*.yaml")):
        train = yaml.safe_load(path.read_text())["train"]
        sections = {"loss": train.get("loss", {}), "crt_loss": train.get("two_stage", {}).get("crt_loss", {})}
        for key, loss in sections.items():
            if loss.get("reweight", "none") == "none" and loss.get("drw_epoch") is None:
                continue
            weighted += 1
            if loss.get("name", "ce") not in BATCH_MEAN_LOSSES and "normalise" not in loss:
                unnamed.append(f"{path.name}: {key}")
    assert weighted >= 5 and not unnamed, unnamed
