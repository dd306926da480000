"""The same script with hpc_train.dist.setup() for the process group; falls off the end (setup's teardown runs
at exit)."""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hpc_train.dist import setup

env = setup()
model = DDP(torch.nn.Linear(10, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
print("done", env.rank)
