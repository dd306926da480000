"""The input-pipeline optimisations of BENCHMARKS.md, before and after, one batch at a time.

    .venv/bin/python benchmarks/pipeline_variants.py [--busy 2]

Times one training batch (128 CIFAR-shaped images: gather, random crop with 4-pixel zero padding,
flip, normalise) with each successive version of ``DeviceImages``' batch path, interleaved, on 1 and on
2 CPU threads; ``--busy N`` starts N spinning processes first (a node shared with other work). All
versions produce the same tensor (checked). Not part of ``run.py``: it documents how we got here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import CIFAR_MEAN, CIFAR_STD, cifar_shaped_lt, interleave, spread, timer  # noqa: E402

P, B = 4, 128


def variants():
    import torch

    data = cifar_shaped_lt(5000, test_per_class=1)
    images = torch.from_numpy(data.train.images)
    n, c, h, w = images.shape
    mean, std = torch.tensor(CIFAR_MEAN).view(1, -1, 1, 1), torch.tensor(CIFAR_STD).view(1, -1, 1, 1)
    padded = torch.nn.functional.pad(images, (P, P, P, P))
    s = padded.stride()
    windows = padded.as_strided((n, 2 * P + 1, 2 * P + 1, c, h, w), (s[0], s[2], s[3], s[1], s[2], s[3]))
    both = torch.stack([padded, padded.flip(3)], 1)
    s2 = both.stride()
    windows2 = both.as_strided((n, 2, 2 * P + 1, 2 * P + 1, c, h, w), (s2[0], s2[1], s2[3], s2[4], s2[2], s2[3], s2[4]))
    gen = torch.Generator().manual_seed(0)
    idx = torch.randperm(n, generator=gen)[:B]
    offsets = torch.randint(0, 2 * P + 1, (B, 2), generator=gen)
    flips = torch.rand(B, generator=gen) < 0.5
    left2 = torch.where(flips, 2 * P - offsets[:, 1], offsets[:, 1])

    def normalise(x):
        return x.float().div_(255.0).sub_(mean).div_(std)

    def per_pixel_indexing():  # the pipeline before (commit 5042809): pad the batch, index every pixel
        x = images[idx]
        pad = torch.nn.functional.pad(x, (P, P, P, P))
        rows = (offsets[:, 0:1] + torch.arange(h))[:, None, :, None]
        cols = (offsets[:, 1:2] + torch.arange(w))[:, None, None, :]
        x = pad[torch.arange(B)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]
        x = torch.where(flips[:, None, None, None], x.flip(3), x)
        return (x.float().div_(255.0) - mean) / std

    def window_gather_masked_flip():  # step 1: pre-padded set, crops as one gather; flip by torch.where
        x = windows[idx, offsets[:, 0], offsets[:, 1]]
        return normalise(torch.where(flips[:, None, None, None], x.flip(3), x))

    def both_orientations_gather():  # step 2 (now): mirrored copy stored too, crop and flip in one gather
        return normalise(windows2[idx, flips.long(), offsets[:, 0], left2])

    fns = {"per_pixel_indexing": per_pixel_indexing, "window_gather_masked_flip": window_gather_masked_flip,
           "both_orientations_gather": both_orientations_gather}
    first = per_pixel_indexing()
    assert all(torch.equal(first, f()) for f in fns.values())
    return fns


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=0, help="spinning processes to start first")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        fns = variants()
        runs = {}
        for threads in (1, 2):
            for name, fn in fns.items():
                def once(fn=fn, threads=threads) -> float:
                    torch.set_num_threads(threads)
                    elapsed = timer()
                    fn()
                    return 1000 * elapsed()
                runs[f"{name} @{threads} thread(s)"] = once
        times = interleave(runs, args.rounds)
    finally:
        for p in spinners:
            p.kill()
    print(f"one batch of {B} images, ms (median, min-max over {args.rounds} interleaved rounds; {args.busy} busy processes)")
    for name, values in times.items():
        st = spread(values)
        print(f"  {name:45s} {st['median']:7.3f}  ({st['min']:.3f}-{st['max']:.3f})  = {B / st['median'] * 1000:,.0f} img/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
