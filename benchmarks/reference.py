"""The references: what a user runs without hpc-train, written as LDAM-DRW's ``cifar_train.py`` does it.

* Input: a torchvision-style CIFAR data set (HWC uint8 arrays, ``Image.fromarray`` per sample, as
  ``torchvision.datasets.CIFAR10.__getitem__`` does) with the per-sample PIL transform
  ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize``, through a
  ``DataLoader`` (batch 128, shuffled, 2 workers, not persistent: a new pair of workers every epoch).
* Training: the eager loop of ``cifar_train.py::train`` — average meters, ``loss.item()`` and top-1/5
  accuracy every step, a log line every 10 steps — with the learning rate set once per epoch by its
  ``adjust_learning_rate`` (linear warm-up over 5 epochs, ×0.01 after 160 and 180).

The model, loss and optimizer objects are the same classes ours uses (the comparison is about the loop
and the input path, not about re-implementing ResNet-32). ``tests/bench`` checks that, fed the same
batches with the same crops and flips, these produce the same losses as our trainer.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, TextIO

import numpy as np
import torch
import torch.utils.data
from PIL import Image
from torch import nn

from .common import CIFAR_MEAN, CIFAR_STD


def train_transform(mean=CIFAR_MEAN, std=CIFAR_STD, padding: int = 4, size: int = 32):
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomCrop(size, padding=padding),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean, std),
    ])


def eval_transform(mean=CIFAR_MEAN, std=CIFAR_STD):
    from torchvision import transforms

    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])


class CifarLikeDataset(torch.utils.data.Dataset):
    """torchvision's CIFAR10 access pattern over our arrays: ``data`` is N×H×W×C uint8, ``targets`` a
    list of ints, and every item goes through PIL."""

    def __init__(self, images_nchw: np.ndarray, labels: np.ndarray, transform: Callable | None) -> None:
        self.data = np.ascontiguousarray(images_nchw.transpose(0, 2, 3, 1))
        self.targets = [int(v) for v in labels]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        img, target = Image.fromarray(self.data[index]), self.targets[index]
        if self.transform is not None:
            img = self.transform(img)
        return img, target


def train_loader(dataset: CifarLikeDataset, *, batch_size: int = 128, workers: int = 2,
                 batch_sampler: Iterable | None = None) -> torch.utils.data.DataLoader:
    """cifar_train.py's loader (``pin_memory=True`` there; it only matters, and only works, with CUDA).
    ``batch_sampler`` replaces the shuffle when a test replays our data order."""
    pin = torch.cuda.is_available()
    if batch_sampler is not None:
        return torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers, pin_memory=pin)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                       pin_memory=pin)


# --------------------------------------------------------------------------------------------------
# The training loop (cifar_train.py's shape)
# --------------------------------------------------------------------------------------------------


class AverageMeter:
    def __init__(self, name: str, fmt: str = ":f") -> None:
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[torch.Tensor]:
    """Precision@k in percent, as the classic ImageNet example and LDAM-DRW's utils compute it."""
    with torch.no_grad():
        maxk = min(max(topk), output.size(1))
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        return [correct[:min(k, maxk)].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / target.size(0))
                for k in topk]


def adjust_learning_rate(optimizer: torch.optim.Optimizer, epoch: int, base_lr: float) -> float:
    """cifar_train.py: epoch counts from 0; warm-up lr·(e+1)/5 for e < 5; ×0.01 after 160, ×0.0001 after 180."""
    epoch = epoch + 1
    if epoch <= 5:
        lr = base_lr * epoch / 5
    elif epoch > 180:
        lr = base_lr * 0.0001
    elif epoch > 160:
        lr = base_lr * 0.01
    else:
        lr = base_lr
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def train_epoch(loader: Iterable, model: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer,
                epoch: int, *, device: torch.device, log: TextIO, print_freq: int = 10,
                on_loss: Callable[[float], Any] | None = None) -> dict[str, float]:
    """One epoch the way cifar_train.py's ``train()`` runs it. Returns the epoch's meters."""
    batch_time, data_time = AverageMeter("Time"), AverageMeter("Data")
    losses, top1, top5 = AverageMeter("Loss"), AverageMeter("Acc@1"), AverageMeter("Acc@5")
    model.train()
    end = time.time()
    n_batches = len(loader) if hasattr(loader, "__len__") else -1
    for i, (inputs, target) in enumerate(loader):
        data_time.update(time.time() - end)
        if device.type == "cuda":
            inputs = inputs.cuda(device, non_blocking=True)
            target = target.cuda(device, non_blocking=True)
        output = model(inputs)
        loss = criterion(output, target)

        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), inputs.size(0))
        top1.update(acc1[0], inputs.size(0))
        top5.update(acc5[0], inputs.size(0))
        if on_loss is not None:
            on_loss(losses.val)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        batch_time.update(time.time() - end)
        end = time.time()
        if i % print_freq == 0:
            log.write(f"Epoch: [{epoch}][{i}/{n_batches}], lr: {optimizer.param_groups[-1]['lr']:.5f}\t"
                      f"Time {batch_time.val:.3f} ({batch_time.avg:.3f})\tData {data_time.val:.3f} "
                      f"({data_time.avg:.3f})\tLoss {losses.val:.4f} ({losses.avg:.4f})\t"
                      f"Prec@1 {float(top1.val):.3f} ({float(top1.avg):.3f})\t"
                      f"Prec@5 {float(top5.val):.3f} ({float(top5.avg):.3f})\n")
            log.flush()
    return {"loss": losses.avg, "top1": float(top1.avg), "batch_time_s": batch_time.avg}


@torch.no_grad()
def validate(loader: Iterable, model: nn.Module, *, device: torch.device) -> list[float]:
    """cifar_train.py's ``validate()`` core: predictions of the whole split, then per-class accuracy
    from a confusion matrix (sklearn there; a bincount here, the same numbers)."""
    model.eval()
    preds, targets = [], []
    for inputs, target in loader:
        if device.type == "cuda":
            inputs = inputs.cuda(device, non_blocking=True)
            target = target.cuda(device, non_blocking=True)
        output = model(inputs)
        _, pred = torch.max(output, 1)
        preds.extend(pred.cpu().numpy())
        targets.extend(target.cpu().numpy())
    y, p = np.asarray(targets), np.asarray(preds)
    classes = int(max(y.max(), p.max())) + 1
    hits = np.bincount(y[y == p], minlength=classes)
    counts = np.bincount(y, minlength=classes)
    return [float(h / c) if c else 0.0 for h, c in zip(hits, counts)]
