"""What one command creates on disk, removed again if it fails: bad input or a refusal leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import rundir


class Created:
    """Directories and files a submission makes, removed again (newest first) when it fails."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.replaced: list[tuple[Path, str]] = []
        """Files that existed (a continued run's job.yaml), with what they held: put back on undo."""

    def mkdir(self, path: Path, hint: str = "choose another runs directory (--runs-dir)") -> Path:
        """``mkdir -p`` that remembers what it made; an impossible directory is a ConfigError (exit 2)."""
        missing = []
        probe = path
        while not probe.exists():
            missing.append(probe)
            if probe.parent == probe:
                break
            probe = probe.parent
        try:
            for directory in reversed(missing):
                directory.mkdir()
                self.paths.append(directory)
            if not path.is_dir():
                raise NotADirectoryError(20, "Not a directory")
        except OSError as exc:
            self.undo()
            raise ConfigError(f"cannot create {path}: {exc.strerror or exc}; {hint}") from None
        return path

    def write(self, path: Path, text: str) -> None:
        """Write a file whole (atomically); an impossible write undoes everything and is exit 2."""
        existed = path.exists()
        try:
            if existed:
                self.replaced.append((path, path.read_text(encoding="utf-8")))
            rundir.write_text_atomic(path, text)
        except (OSError, UnicodeError) as exc:
            self.undo()
            raise ConfigError(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}") from None
        if not existed:
            self.paths.append(path)

    def link(self, path: Path, target: Path) -> None:
        """A symbolic link to ``target`` (relative when it can be), undone like a file."""
        import os

        try:
            path.symlink_to(os.path.relpath(target, path.parent))
        except OSError as exc:
            self.undo()
            raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
        self.paths.append(path)

    def undo(self) -> None:
        for path, old in reversed(self.replaced):
            try:
                rundir.write_text_atomic(path, old)
            except OSError:
                pass  # the undo of a failed write: the error that started it is the one reported
        self.replaced.clear()
        for path in reversed(self.paths):
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                pass  # not empty: something else lives there now
        self.paths.clear()
