"""The same Trainer script with its documented last line, hpc_train.dist.leave(0) (examples/hf_trainer.py)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from hpc_train.dist import leave  # noqa: E402

data = [{"input_ids": (torch.arange(8) + i) % 16, "labels": (torch.arange(8) + i) % 16} for i in range(64)]
model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                                   eos_token_id=0))
args = TrainingArguments(output_dir="hf-exit-client", max_steps=5,
                         per_device_train_batch_size=4, use_cpu=True, save_strategy="no", report_to="none",
                         disable_tqdm=True, ddp_find_unused_parameters=False)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
print("done", args.process_index)
leave(0)
