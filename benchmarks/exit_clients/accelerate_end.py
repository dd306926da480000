"""An accelerate script (Accelerator on hpc-train's mapping, CPU/gloo, a DDP model, a few steps) that falls off
the end, as accelerate's own examples do (issue 27 saw 3 aborts in 5 such runs)."""
import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(10, 10)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(5):
    optimizer.zero_grad()
    accelerator.backward(model(torch.randn(4, 10)).sum())
    optimizer.step()
accelerator.wait_for_everyone()
print("done", accelerator.process_index)
