"""A torchrun-style DDP script that never heard of hpc-train: env:// gloo, a few steps, falls off the end."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(10, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
print("done", dist.get_rank())
