"""The same accelerate script with its documented last line, hpc_train.dist.leave(0) (examples/accelerate_script.py)."""
import torch
from accelerate import Accelerator

from hpc_train.dist import leave

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(10, 10)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(5):
    optimizer.zero_grad()
    accelerator.backward(model(torch.randn(4, 10)).sum())
    optimizer.step()
accelerator.wait_for_everyone()
print("done", accelerator.process_index)
leave(0)
