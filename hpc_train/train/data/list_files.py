"""List files (ImageNet-LT / Places-LT / iNaturalist: ``relative/path label`` per line), read and checked
before any rank trains: every path stays under the image root (no absolute path, no ``..``, no symlink that
leads out), every file it names is a regular file, every label is an integer >= 0, and the held-out and
test labels are classes of the training list. A wrong line is a :class:`~.sources.DataError` (exit 2) naming
``file:line``.

Every entry is checked, not a sample: a missing image found at step 30,000 costs a day of GPUs. The check
reads each image directory once (``os.scandir``: one listing, no stat per image, cheap on a network
filesystem too), and resolves only the entries that are symlinks.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .sources import DataError


@dataclass(frozen=True)
class ListEntry:
    """One image of a list file: its path relative to the image root, its label, and the line it is on."""

    path: str
    label: int
    line: int


def read_entries(list_path: Path) -> list[ListEntry]:
    """The entries of ``list_path`` (blank lines and ``#`` comments skipped; a path may contain spaces, the
    label is the last field); a malformed line or a path that leaves the root is refused with file:line."""
    lines = _read_text(list_path).splitlines()
    entries = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.rsplit(None, 1)
        if len(parts) != 2 or not parts[1].isascii() or not parts[1].isdigit():
            raise DataError(f"{list_path}:{number}: expected 'relative/path label' with an integer label >= 0, "
                            f"got {text[:200]!r}")
        _check_relative(list_path, number, parts[0])
        entries.append(ListEntry(parts[0], int(parts[1]), number))
    if not entries:
        raise DataError(f"list file {list_path} has no entries")
    return entries


def _read_text(list_path: Path) -> str:
    """The list file's text: a regular file only (a FIFO or a device would block or never end)."""
    try:
        fd = os.open(list_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DataError(f"list file not found: {list_path}; set train.data.train_list/test_list "
                        "(absolute, or relative to train.data.root)") from None
    except OSError as exc:
        raise DataError(f"cannot read list file {list_path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataError(f"list file {list_path} is not a regular file; train.data.*_list must name a text file")
        try:
            return f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read list file {list_path}: {exc}") from None


def _check_relative(list_path: Path, number: int, path: str) -> None:
    # Lexically first (cheap, and what a symlink check cannot see: '..' through a real directory).
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or "\0" in path:
        raise DataError(f"{list_path}:{number}: {shown(path)} leaves the image root: list paths are relative to "
                        "train.data.root, without '..'")


def check_files(entries: list[ListEntry], list_path: Path, image_root: Path) -> None:
    """Every entry names a regular file under ``image_root`` (a symlink may point only inside it)."""
    try:
        root = Path(os.path.realpath(image_root))
    except (OSError, ValueError) as exc:
        raise DataError(f"train.data.root {image_root} cannot be resolved: {exc}") from None
    if not root.is_dir():
        raise DataError(f"{list_path}: the image root {image_root} is not a directory; set train.data.root")
    listings: dict[str, dict[str, os.DirEntry] | str] = {}
    for entry in entries:
        parent, _, name = entry.path.rpartition("/")
        listing = listings.get(parent)
        if listing is None:
            listing = listings[parent] = _listing(root, parent)
        problem = listing if isinstance(listing, str) else _problem(listing.get(name), root)
        if problem:
            raise DataError(f"{list_path}:{entry.line}: {shown(entry.path)} {problem}; train.data.root must be the "
                            "directory the list's relative paths start from")


def _listing(root: Path, parent: str) -> dict[str, os.DirEntry] | str:
    """The entries of one image directory by name, or why it cannot be used."""
    folder = root / parent
    real = os.path.realpath(folder)
    if not _inside(real, root):
        return f"is under {folder}, which leads out of the image root (to {real})"
    try:
        with os.scandir(real) as found:
            return {e.name: e for e in found}
    except FileNotFoundError:
        return f"does not exist under {root} (no directory {folder})"
    except NotADirectoryError:
        return f"does not exist under {root} ({folder} is not a directory)"
    except OSError as exc:
        return f"cannot be read: {exc.strerror} ({folder})"


def _problem(found: os.DirEntry | None, root: Path) -> str:
    if found is None:
        return f"does not exist under {root}"
    try:
        if found.is_symlink():
            target = os.path.realpath(found.path)
            if not _inside(target, root):
                return f"is a symlink out of the image root (to {target})"
            return "" if os.path.isfile(target) else "is a symlink to something that is not a regular file"
        return "" if found.is_file(follow_symlinks=False) else "is not a regular file"
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"


def shown(path: str) -> str:
    """A listed path as the message shows it: as written, or quoted where it holds control characters."""
    return path[:200] if path.isprintable() else repr(path[:200])


def _inside(path: str, root: Path) -> bool:
    return path == str(root) or path.startswith(str(root).rstrip("/") + "/")


def check_labels(entries: list[ListEntry], list_path: Path, num_classes: int) -> None:
    """Every label is one of the training list's ``num_classes`` classes (0 .. num_classes-1)."""
    for entry in entries:
        if entry.label >= num_classes:
            raise DataError(f"{list_path}:{entry.line}: label {entry.label} is not a class of the training list "
                            f"(it has {num_classes}: labels 0..{num_classes - 1})")


def class_count(entries: list[ListEntry], list_path: Path) -> int:
    """The training list's classes: 0 .. the largest label, each with at least one image (a class without one
    has no count for the long-tail methods to weigh, and a stray huge label would size the classifier)."""
    seen = {e.label for e in entries}
    count = max(seen) + 1
    if len(seen) != count:
        missing = next(i for i, label in enumerate(sorted(seen)) if label != i)  # never range(count): it may be huge
        first_above = min((e for e in entries if e.label > missing), key=lambda e: e.line)
        raise DataError(f"{list_path}: class {missing} has no image, but labels go up to {count - 1} (first above it: "
                        f"line {first_above.line}, label {first_above.label}); labels must be 0..C-1, each class "
                        "with at least one training image")
    return count
