"""A Hugging Face ``Trainer`` script under hpc-train's contract (docs/commands.md, "The Hugging Face Trainer"),
on CPUs (gloo) or GPUs.

    hpc-train submit --cluster local --tasks-per-node 2 -- python examples/hf_trainer.py --steps 60
    hpc-train submit --nodes 2 --tasks-per-node 1 -- python examples/hf_trainer.py

A tiny GPT-2 built from a config (no hub download: the HF offline variables are set below) learns to continue
counting sequences (token t+1 follows token t). hpc-train starts one process per rank and exports the mapping
torchrun would; the Trainer reads it through accelerate (transformers 5.23: ``TrainingArguments._setup_devices``,
transformers/training_args.py:1876-1901, builds accelerate's ``PartialState``, which takes RANK / WORLD_SIZE /
LOCAL_RANK from the environment: accelerate/state.py:247-262). The contract, line by line:

* ``catch_preemption()`` first: hpc-train's signal (USR2) then sets a flag instead of ending the rank;
* ``use_cpu=True`` on a machine without CUDA: without it ``_setup_devices`` builds ``PartialState(cpu=False)``
  (training_args.py:1876-1878), which finds LOCAL_RANK but no GPU and leaves every rank at world size 1;
* ``output_dir`` under ``HPC_TRAIN_CHECKPOINT_DIR`` (per run, the same after a requeue), never the working
  directory (``<run dir>/work`` by default, or the submit directory every run shares under ``workdir: submit``);
* a ``TrainerCallback`` agrees on the flag at each step end (one all-reduce: the ranks must stop at the same
  step) and sets ``control.should_save`` and ``control.should_training_stop`` (TrainerControl,
  transformers/trainer_callback.py:240-264). The Trainer calls ``on_step_end`` and then
  ``_maybe_log_save_evaluate``, which saves ``checkpoint-<global step>`` when ``should_save`` is set
  (trainer.py:1947-1958, 2276-2278; ``_save_checkpoint``, trainer.py:3355), and leaves its loop on
  ``should_training_stop`` (trainer.py:1963-1966); the script then leaves with 75;
* the saved directory is not written atomically (``_save_checkpoint`` fills ``checkpoint-N`` file by file, every
  rank its RNG state), and ``get_last_checkpoint`` (transformers/trainer_utils.py:270) takes the newest
  ``checkpoint-N`` directory whatever is in it. So ``on_save`` waits for every rank and rank 0 then marks the
  checkpoint complete; a relaunch resumes (``resume_from_checkpoint``) from the newest marked one only;
* ``leave(code)`` last: no interpreter finalisation, so a finished rank cannot abort (exit 134) at exit.
"""

from hpc_train.dist import catch_preemption, heartbeat, launch_info, leave, stop_requested

catch_preemption()

import os  # noqa: E402

for _offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_offline, "1")  # a model built from a config: nothing to download, and no one tries

import argparse  # noqa: E402 - the handler goes in before anything slow is imported
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

COMPLETE = "hpc-train-complete"
"""Written by rank 0 into a checkpoint directory once every rank has saved its part."""
VOCAB = 16
SEQUENCE = 8


class CountingSequences(torch.utils.data.Dataset):
    """Sequences start, start+1, ... (mod VOCAB): a pattern a one-layer model learns in a few dozen steps."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = (torch.arange(SEQUENCE) + index) % VOCAB
        return {"input_ids": tokens, "labels": tokens}  # GPT2LMHeadModel shifts the labels itself


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=32, n_layer=1, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def all_ranks_agree(flag: bool, device: torch.device) -> bool:
    """Whether any rank has the flag: every rank must stop (and save) at the same step, or the others would wait
    forever in their next collective."""
    if not dist.is_initialized():
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class HpcTrainPreemption(TrainerCallback):
    """On hpc-train's signal: save at this step's end and stop; mark a finished checkpoint complete."""

    def __init__(self) -> None:
        self.preempted = False

    def on_step_end(self, args, state, control, **kwargs):
        heartbeat(step=state.global_step)
        if all_ranks_agree(stop_requested(), args.device):
            self.preempted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if dist.is_initialized():
            dist.barrier()  # every rank has written its part (RNG state) of checkpoint-<step>
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            with open(os.path.join(folder, COMPLETE), "w") as handle:
                handle.write(f"{state.global_step}\n")
        if dist.is_initialized():
            dist.barrier()  # no rank leaves before the mark is there
        return control


class ExtraWork(TrainerCallback):
    """Makes each step take longer, so that a test has time to preempt the run."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.step_s)
        return control


def newest_complete_checkpoint(output_dir: str) -> str | None:
    """The ``checkpoint-N`` with the highest N that rank 0 marked complete, or None."""
    if not os.path.isdir(output_dir):
        return None
    steps = [int(m.group(1)) for name in os.listdir(output_dir) if (m := re.fullmatch(r"checkpoint-(\d+)", name))
             and os.path.exists(os.path.join(output_dir, name, COMPLETE))]
    return os.path.join(output_dir, f"checkpoint-{max(steps)}") if steps else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=0.0, help="extra time per step (a stand-in for real work)")
    args = parser.parse_args()
    info = launch_info()
    output_dir = os.path.join(info["checkpoint_dir"] or "checkpoints", "trainer")
    training_args = TrainingArguments(
        output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=16, learning_rate=3e-3,
        use_cpu=not torch.cuda.is_available(), save_strategy="no",  # saved on hpc-train's signal only
        logging_steps=10, report_to="none", disable_tqdm=True, seed=0, dataloader_num_workers=0,
        ddp_find_unused_parameters=False)  # every parameter is used: no extra autograd traversal per step
    preemption = HpcTrainPreemption()
    callbacks = [preemption, ExtraWork(args.step_s)] if args.step_s else [preemption]
    trainer = Trainer(model=tiny_gpt2(), args=training_args, train_dataset=CountingSequences(), callbacks=callbacks)
    resume = newest_complete_checkpoint(output_dir)
    resumed_from = int(resume.rsplit("-", 1)[1]) if resume else 0
    rank, world_size = training_args.process_index, training_args.world_size
    print(f"rank {rank}/{world_size}: {training_args.parallel_mode}, restart {info['restart']}, "
          f"starting at step {resumed_from}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    step = trainer.state.global_step
    if preemption.preempted:
        if trainer.is_world_process_zero():
            print(f"saved checkpoint-{step}; leaving with {info['exit_requeue']}", flush=True)
        leave(info["exit_requeue"])
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"rank {rank}: done at step {step}: training loss "
          f"{' -> '.join(f'{loss:.3f}' for loss in losses[:1] + losses[-1:])}", flush=True)
    if trainer.is_world_process_zero() and info["run_dir"]:
        with open(os.path.join(info["run_dir"], "result.json"), "w") as handle:
            json.dump({"step": step, "resumed_from": resumed_from, "restart": info["restart"],
                       "world_size": world_size, "losses": losses}, handle)
    if dist.is_initialized():
        dist.barrier()
    return 0


if __name__ == "__main__":
    leave(main())
