"""The same script with setup() and its documented last line, hpc_train.dist.leave(0)."""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hpc_train.dist import leave, setup

env = setup()
model = DDP(torch.nn.Linear(10, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
print("done", env.rank)
leave(0)
