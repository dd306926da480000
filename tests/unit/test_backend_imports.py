"""The never-rules of the backends, read from every module's imports (lazy ones inside functions, and typing-only
ones, count too): the two backends are siblings under one front (issue 25), and what belongs to a run lives in
``runs/``, which imports neither backend nor the front.

    runs  -/->  slurm, local, front
    slurm -/->  local, front
    local -/->  slurm, front
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hpc_train"

NEVER = {
    "runs": {"slurm", "local", "front"},
    "slurm": {"local", "front"},
    "local": {"slurm", "front"},
}


def _module_name(path: Path, package_dir: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package_dir: Path = PACKAGE) -> set[str]:
    """Every module ``path`` imports anywhere in it, as absolute names (``from X import y``: X and X.y)."""
    here = _module_name(path, package_dir)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def subpackage(module: str, package_dir: Path = PACKAGE) -> str | None:
    """``hpc_train.runs.status`` -> ``runs``; None outside the package or for its top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "hpc_train" and (package_dir / parts[1]).is_dir() else None


def forbidden_edges(package_dir: Path = PACKAGE) -> dict[str, list[str]]:
    """``{importing module: [forbidden modules it imports]}`` over every module of the package."""
    found: dict[str, list[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        name = _module_name(path, package_dir)
        never = NEVER.get(subpackage(name, package_dir) or "", set())
        bad = sorted(m for m in imported_modules(path, package_dir) if subpackage(m, package_dir) in never)
        if bad:
            found[name] = bad
    return found


def test_the_backends_are_siblings_and_runs_imports_neither_nor_the_front():
    assert forbidden_edges() == {}, "a run's concerns go to runs/, a backend's choice to front/ (docs/design.md)"


def test_the_walker_sees_lazy_and_relative_imports(tmp_path):
    # The rule is only as good as the walker: an import inside a function, two levels up, is still seen.
    package_dir = tmp_path / "hpc_train"
    for folder in ("runs", "slurm", "local"):
        (package_dir / folder).mkdir(parents=True)
    (package_dir / "runs" / "example.py").write_text(
        "def later():\n    from ..slurm import client\n    import hpc_train.local.plan\n")
    (package_dir / "slurm" / "client.py").write_text("from ..runs import example\n")  # slurm -> runs is allowed
    assert forbidden_edges(package_dir) == {
        "hpc_train.runs.example": ["hpc_train.local.plan", "hpc_train.slurm", "hpc_train.slurm.client"]}
