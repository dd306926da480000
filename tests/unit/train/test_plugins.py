"""Plug-ins: a model and a loss from a package the test writes train the digits job (the model's own layers in
the checkpoint, its width in the plan), --dry-run imports and checks them, a plug-in loss is normalised over
the global batch as the built-in ones are, bad plug-ins are exit 2 with one line; train.tensorboard writes the
scalars of metrics.jsonl as event files (read back here by an independent decoder)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import DIGITS_QUICK, clean_env, write_job

PACKAGE = {
    "__init__.py": "",
    "models.py": '''
from torch import nn


def build(num_classes, in_channels, width=12):
    """A plug-in backbone: images -> (N, width) features."""
    net = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten())
    net.feature_dim = width
    return net


def scaled_ce(counts, scale=1.0):
    import torch.nn.functional as F

    def loss(logits, target):
        return scale * F.cross_entropy(logits, target, reduction="none")
    return loss


def mean_loss(counts):
    import torch.nn.functional as F

    return lambda logits, target: F.cross_entropy(logits, target)  # wrong: one value, not per sample
''',
}


def write_package(root: Path) -> None:
    (root / "labplug").mkdir()
    for name, text in PACKAGE.items():
        (root / "labplug" / name).write_text(text)


def train(job: Path, *args: str, cwd: Path):
    return subprocess.run([sys.executable, "-m", "hpc_train.train", str(job), *args], cwd=cwd,
                          env=clean_env(cwd), capture_output=True, text=True, timeout=300)


def test_a_plugin_model_and_loss_train_the_digits_job(tmp_path):
    write_package(tmp_path)
    plugins = {"model": {"name": "labplug.models:build", "args": {"width": 6}},
               "loss": {"name": "labplug.models:scaled_ce", "args": {"scale": 1.0}},
               "tensorboard": True, "epochs": 2}
    job = write_job(tmp_path / "job.yaml", {**DIGITS_QUICK, **plugins})
    plan = train(job, "--dry-run", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    # small_cnn has 93,706 parameters; the plug-in at width 6 (not its default 12): conv 1*6*9 + BN 12 + linear 6*10+10.
    assert "labplug.models:build (136 parameters" in plan.stdout, plan.stdout
    result = train(job, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"record": ' not in line]
    assert [m["epoch"] for m in metrics] == [1, 2]
    import torch

    (checkpoint,) = sorted((run_dir / "checkpoints").glob("*.pt"))[-1:]
    weights = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    assert tuple(weights["backbone.0.weight"].shape) == (6, 1, 3, 3) and "classifier.weight" in weights
    assert_events_match(run_dir, metrics)


def test_bad_plugins_are_exit_2_with_one_line(tmp_path):
    write_package(tmp_path)
    cases = [({"model": {"name": "labplug.models:build", "args": {"depth": 3}}}, "unexpected keyword argument 'depth'"),
             ({"model": {"name": "labplug.nowhere:build"}}, "cannot import 'labplug.nowhere'"),
             ({"loss": {"name": "labplug.models:mean_loss"}}, "must return per-sample values of shape"),
             ({"model": {"name": "small_cnn", "args": {"width": 3}}}, "train.model.args: are for plug-ins")]
    for i, (train_cfg, words) in enumerate(cases):
        job = write_job(tmp_path / f"bad-{i}.yaml", {**DIGITS_QUICK, **train_cfg, "epochs": 1})
        args = [] if "mean_loss" in json.dumps(train_cfg) else ["--dry-run"]
        result = train(job, *args, "--run-dir", str(tmp_path / f"run-{i}"), cwd=tmp_path)
        assert result.returncode == 2, (train_cfg, result.stderr)
        assert words in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) <= 3, result.stderr  # the plan's log line, then the error


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_plugin_loss_is_normalised_over_the_global_batch_like_the_builtin(tmp_path, monkeypatch, world_size):
    import torch

    from hpc_train.config import LossConfig
    from hpc_train.train.model.losses import build_loss

    write_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    counts = [50, 20, 5]
    logits, target = torch.randn(12, 3, dtype=torch.float64), torch.randint(0, 3, (12,))
    for reweight in ("none", "class_balanced"):
        builtin = build_loss(LossConfig(name="ce", reweight=reweight), counts, world_size)
        plugin = build_loss(LossConfig(name="labplug.models:scaled_ce", reweight=reweight), counts, world_size)
        share = slice(0, 5)  # this rank's share of the global batch
        assert torch.equal(plugin(logits[share], target[share], target), builtin(logits[share], target[share], target))


# ------------------------------------------------------------------------------------------------
# TensorBoard event files, read by a decoder written here from the format (TFRecord + Event protobuf)
# ------------------------------------------------------------------------------------------------

def _crc32c_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 * (crc & 1))
    return crc ^ 0xFFFFFFFF


def _unmask(value: int) -> int:
    rot = (value - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def _fields(data: bytes):
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            length, i = _varint(data, i)
            value, i = data[i:i + length], i + length
        yield number, value


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def read_events(path: Path) -> list[tuple[int, dict[str, float]]]:
    data, i, out = path.read_bytes(), 0, []
    while i < len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        assert _unmask(struct.unpack("<I", data[i + 8:i + 12])[0]) == _crc32c_bitwise(header)
        body = data[i + 12:i + 12 + length]
        assert _unmask(struct.unpack("<I", data[i + 12 + length:i + 16 + length])[0]) == _crc32c_bitwise(body)
        i += 16 + length
        fields = dict(_fields(body))
        if 5 in fields:
            scalars = {}
            for number, value in _fields(fields[5]):
                parts = dict(_fields(value))
                scalars[parts[1].decode()] = struct.unpack("<f", parts[2])[0]
            out.append((fields.get(2, 0), scalars))
        else:
            assert fields[3] == b"brain.Event:2"
    return out


def assert_events_match(run_dir: Path, metrics: list[dict]) -> None:
    assert _crc32c_bitwise(b"123456789") == 0xE3069283  # CRC-32C's check value
    (events_file,) = (run_dir / "tensorboard").glob("events.out.tfevents.*")
    events = read_events(events_file)
    assert [step for step, _ in events] == [m["global_step"] for m in metrics]
    for (_, scalars), record in zip(events, metrics):
        for name in ("top1", "balanced", "many", "medium", "few"):
            assert scalars[f"test/{name}"] == pytest.approx(record[name], rel=1e-6)  # float32 in the file
