"""House rules a test can keep: one job per module (no module in hpc_train/ over 450 lines, no function over 70),
the torch line (only train/ imports torch; the rank side imports nothing heavy), and the design notes the code
cites live in the repository (docs/), not in a file it does not hold."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450

# Modules whose split belongs to an open issue that rewrites them, capped at their length today so they
# cannot grow meanwhile (none at present).
PENDING_SPLIT: dict[str, int] = {}


def test_no_module_passes_450_lines():
    too_long = {}
    for path in sorted((ROOT / "hpc_train").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > PENDING_SPLIT.get(name, MAX_LINES):
            too_long[name] = lines
    assert not too_long, f"split these modules by job (at most {MAX_LINES} lines each): {too_long}"


def test_pending_splits_are_still_pending():
    # Once a module is back under the limit, it leaves the exception list.
    for name in PENDING_SPLIT:
        assert len((ROOT / name).read_text(encoding="utf-8").splitlines()) > MAX_LINES, f"drop {name} from PENDING_SPLIT"


def test_cited_documents_are_in_the_repository():
    cited = re.compile(r"\b(?:docs/)?([A-Za-z_-]+\.md)\b")
    # The repository's own files: what git tracks (caches and venvs the test runs leave are not the project's).
    tracked = [ROOT / name for name in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                                       check=True).stdout.splitlines()]
    sources = [p for p in tracked if p.suffix in (".py", ".j2", ".md", ".yaml")
               and p.relative_to(ROOT).parts[0] in ("hpc_train", "templates", "docs", "tests", "benchmarks", "jobs")]
    sources += [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "Makefile"]
    known = {p.name for p in tracked if p.suffix == ".md"}
    missing = {}
    for path in sources:
        for name in cited.findall(path.read_text(encoding="utf-8", errors="replace")):
            if name not in known and name != "SKILL.md":
                missing.setdefault(name, path.relative_to(ROOT).as_posix())
    assert not missing, f"cited but not in the repository: {missing}"


# --------------------------------------------------------------------------------------------------
# The torch line (docs/design.md, "Where each concern lives")
# --------------------------------------------------------------------------------------------------

PACKAGE = ROOT / "hpc_train"
TORCH_SIDE = "hpc_train.train"
# In train/ but torch-free on purpose: the package itself, the entrypoint (its handlers come first) and the
# public path of the submitit callables, which queued jobs' pickles name.
TRAIN_TORCH_FREE = {"hpc_train.train", "hpc_train.train.__main__", "hpc_train.train.callable"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(imported when the module is imported, imported anywhere in it): absolute module names, with
    ``from X import y`` counted as X and X.y."""
    import ast

    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    at_import, anywhere = set(), set()

    def names(node) -> set[str]:
        if isinstance(node, ast.Import):
            return {a.name for a in node.names}
        base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
        module = ".".join(base + ([node.module] if node.module else []))
        return {module} | {f"{module}.{a.name}" for a in node.names}

    def visit(node, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found = names(child)
                anywhere.update(found)
                if top:
                    at_import.update(found)
            deeper = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                deeper = False  # typing only: never imported at run time
            visit(child, deeper)

    visit(tree, True)
    return at_import, anywhere


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
IMPORTS = {name: _imports(path) for name, path in MODULES.items()}


def _on_torch_side(module: str) -> bool:
    return module == TORCH_SIDE or module.startswith(TORCH_SIDE + ".")


def test_nothing_outside_train_imports_the_torch_side_at_import_time():
    reaching = {name: sorted(m for m in IMPORTS[name][0] if _on_torch_side(m) and m in MODULES)
                for name in MODULES if not _on_torch_side(name)}
    assert {k: v for k, v in reaching.items() if v} == {}, "import these inside the function that needs them"


def test_every_module_in_train_imports_torch_or_serves_only_train():
    offenders = {}
    for name in MODULES:
        if not _on_torch_side(name) or name in TRAIN_TORCH_FREE:
            continue
        if any(m == "torch" or m.startswith("torch.") for m in IMPORTS[name][0]):
            continue
        outside = sorted(other for other, (_, anywhere) in IMPORTS.items()
                         if name in anywhere and not _on_torch_side(other))
        if outside:
            offenders[name] = outside
    assert offenders == {}, ("torch-free modules used outside train/ belong on the torch-free side "
                             "(rank/, runs/, config/): " + str(offenders))


def test_rank_side_imports_neither_torch_numpy_nor_submitit():
    rank_modules = sorted(name for name in MODULES if name == "hpc_train.rank" or name.startswith("hpc_train.rank."))
    assert len(rank_modules) >= 7
    code = (f"import sys; import {', '.join(rank_modules)}; "
            "print(','.join(m for m in ('torch', 'numpy', 'submitit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_no_function_passes_70_lines():
    import ast

    long = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 70:
                long[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1
    assert long == {}, f"split these functions (at most 70 lines each): {long}"
