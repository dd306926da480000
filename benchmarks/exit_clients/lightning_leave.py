"""The same module through hpc_train.integrations.lightning (trainer_options(), PreemptionCheckpoint) and the
documented last line, hpc_train.dist.leave(0)."""
import os

from hpc_train.dist import catch_preemption, leave

catch_preemption()

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hpc_train.integrations.lightning import PreemptionCheckpoint, trainer_options  # noqa: E402


class Fit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(10, 10)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


os.environ.setdefault("HPC_TRAIN_CHECKPOINT_DIR", os.path.join(os.getcwd(), "checkpoints"))  # started directly
trainer = pl.Trainer(max_steps=5, callbacks=[PreemptionCheckpoint()], logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, **trainer_options())
trainer.fit(Fit(), DataLoader(TensorDataset(torch.randn(64, 10)), batch_size=4))
print("done", trainer.global_rank)
leave(0)
