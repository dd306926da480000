"""Write CIFAR-10 "python version" files with random pixels — the official layout and sizes (50,000
training and 10,000 test images), so ``cifar10-lt`` recipes run where the real data cannot be fetched
(a GPU machine without network). Speed does not depend on the pixels; accuracy figures from them mean
nothing. Python-3 pickles (the loader reads both kinds; tests/unit/train/cifar_files.py writes either).

    PYTHONPATH=. python3 benchmarks/cifar_files.py --root DIR            # DIR/cifar-10-batches-py/, ~3 s
    PYTHONPATH=. python3 benchmarks/cifar_files.py --root DIR --tiny     # 100 / 20 images per class
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from tests.unit.train.cifar_files import make_arrays, write_cifar10

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="train.data.root of the recipe")
    parser.add_argument("--tiny", action="store_true", help="100 training and 20 test images per class")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    per_class = (100, 20) if args.tiny else (5000, 1000)
    folder = write_cifar10(args.root, *make_arrays(10, *per_class, seed=args.seed), py2=False)
    print(f"wrote {folder} ({10 * per_class[0]} training, {10 * per_class[1]} test images) in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
