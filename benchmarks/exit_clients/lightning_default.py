"""A Lightning module fitted with DDP the way Lightning's docs show it (its own environment, `devices` from the
launcher's LOCAL_WORLD_SIZE, since devices="auto" would be 1 on a CPU), falling off the end of the script."""
import os

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Fit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(10, 10)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = pl.Trainer(max_steps=5, accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy="ddp",
                     logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Fit(), DataLoader(TensorDataset(torch.randn(64, 10)), batch_size=4))
print("done", trainer.global_rank)
