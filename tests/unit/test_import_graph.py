"""The house rules as a test of the import graph (issue 25): which folder may import which, where torch may be
imported, and no import circle, lazy imports included. The graph is read from the source (every ``import`` and
``from ... import``, at module level or inside a function), so a rule breaks the moment an import is written,
not when some test happens to run that path.

Also here: the design notes the code cites live in the repository (docs/), not in a file it does not hold.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpc_train"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> set[str]:
    """The modules an import statement imports: ``from X import y`` is X.y when that is a module of the package
    (``from . import typed``), else X."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
    module = ".".join(base + ([node.module] if node.module else []))
    found = {f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in modules}
    if len(found) < len(node.names):
        found.add(module)
    return found


def _with_parents(names: set[str], here: str) -> set[str]:
    """Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: those are imports too, but for the
    importer's own parent packages (Python has them loading already, and counting them would make every package
    that imports its own modules a circle)."""
    own = {".".join(here.split(".")[:i]) for i in range(1, len(here.split(".")))}
    found = set(names)
    for name in names:
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return found - own


def _imports(path: Path, root: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(imported when the module is imported, imported anywhere in it: in functions too, and under
    ``if TYPE_CHECKING:``, which never runs but still says what the module knows of)."""
    here = _module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    at_import: set[str] = set()
    anywhere: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found = _with_parents(_imported_names(child, package, modules), here)
                anywhere.update(found)
                if top:
                    at_import.update(found)
            deeper = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                deeper = False  # typing only: never imported at run time
            visit(child, deeper)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return at_import, anywhere


def read_package(package_dir: Path) -> tuple[dict[str, Path], dict[str, tuple[set[str], set[str]]], dict[str, list[str]]]:
    """(modules by name, their imports (at import time, anywhere), the graph: module -> the package's modules it
    imports anywhere, lazily too) of the package in ``package_dir``."""
    root = package_dir.parent
    modules = {_module_name(p, root): p for p in sorted(package_dir.rglob("*.py"))}
    imports = {name: _imports(path, root, set(modules)) for name, path in modules.items()}
    graph = {name: sorted(m for m in anywhere if m in modules and m != name) for name, (_, anywhere) in imports.items()}
    return modules, imports, graph


MODULES, IMPORTS, GRAPH = read_package(PACKAGE)


def _within(module: str, folder: str) -> bool:
    """``folder`` is a dotted name under hpc_train (``slurm``, ``train.data``)."""
    prefix = f"hpc_train.{folder}"
    return module == prefix or module.startswith(prefix + ".")


def strongly_connected_components(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the package is deeper than nothing, but recursion limits are no rule)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(graph[successor])))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Every set of modules that import each other round a loop (strongly connected, more than one module)."""
    return sorted(c for c in strongly_connected_components(graph) if len(c) > 1)


def _path(graph: dict[str, list[str]], start: str, targets: set[str]) -> list[str] | None:
    """The shortest import chain from ``start`` to a module of ``targets``, or None."""
    came_from: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        if node in targets and node != start:
            chain = [node]
            while came_from[chain[-1]] is not None:
                chain.append(came_from[chain[-1]])
            return chain[::-1]
        for successor in graph[node]:
            if successor not in came_from:
                came_from[successor] = node
                queue.append(successor)
    return None


def reaching(source: str, forbidden: tuple[str, ...], graph: dict[str, list[str]] = GRAPH) -> dict[str, str]:
    """{module of ``source``: the import chain by which it reaches a module of a ``forbidden`` folder}: through
    any module in between and lazy imports included, since a chain imports the end as surely as one line."""
    targets = {m for m in graph if any(_within(m, f) for f in forbidden)}
    found = {}
    for module in sorted(graph):
        if _within(module, source):
            chain = _path(graph, module, targets)
            if chain:
                found[module] = " -> ".join(chain)
    return found


# --------------------------------------------------------------------------------------------------
# The never-rules: which folder may not import which (docs/design.md, "Where each concern lives")
# --------------------------------------------------------------------------------------------------

NEVER = [
    # A run (its directory, states, liveness) is the same on every backend; the front chooses a backend.
    ("runs", ("slurm", "local", "front")),
    # The backends are siblings: neither uses the other, nor the front above them.
    ("slurm", ("local", "front")),
    ("local", ("slurm", "front")),
    # The job is read, checked and rendered torch-free; what imports a plug-in is above both (plugin_probe).
    ("config", ("train",)),
]


@pytest.mark.parametrize(("source", "forbidden"), NEVER, ids=[f"{s}-never-{'|'.join(f)}" for s, f in NEVER])
def test_never_rules(source, forbidden):
    assert reaching(source, forbidden) == {}


def test_only_a_users_script_imports_the_integrations():
    # The training-library adapters (hpc_train/integrations: Lightning, ...) import their library and torch at import
    # time: a rank's own script imports them, never the CLI's path, hpc-train's own ranks or any module at the top.
    targets = {m for m in GRAPH if _within(m, "integrations")}
    chains = {m: _path(GRAPH, m, targets) for m in sorted(GRAPH) if not _within(m, "integrations")}
    assert targets and {m: " -> ".join(c) for m, c in chains.items() if c} == {}


def test_no_import_circle_lazy_imports_included():
    assert circles(GRAPH) == []


def test_the_circle_finder_finds_a_circle_and_the_rules_a_chain():
    # The two tools the rules above use, on a graph small enough to check by eye.
    graph = {"hpc_train.a": ["hpc_train.b"], "hpc_train.b": ["hpc_train.c.x"], "hpc_train.c.x": ["hpc_train.a"],
             "hpc_train.d": ["hpc_train.a"], "hpc_train.e": []}
    assert circles(graph) == [["hpc_train.a", "hpc_train.b", "hpc_train.c.x"]]
    assert reaching("d", ("c",), graph) == {"hpc_train.d": "hpc_train.d -> hpc_train.a -> hpc_train.b -> hpc_train.c.x"}
    assert reaching("e", ("c",), graph) == {}


def test_the_reader_sees_lazy_relative_typing_and_parent_package_imports(tmp_path):
    # The rules are only as good as the reader: an import inside a function, two levels up, under TYPE_CHECKING, or
    # of a module whose package's __init__ runs first, is an edge all the same.
    package_dir = tmp_path / "hpc_train"
    for folder in ("runs", "slurm", "local"):
        (package_dir / folder).mkdir(parents=True)
        (package_dir / folder / "__init__.py").write_text("")
    (package_dir / "__init__.py").write_text("")
    (package_dir / "runs" / "example.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..local import plan\n"
        "def later():\n    from ..slurm import client\n")
    (package_dir / "local" / "plan.py").write_text("")
    (package_dir / "slurm" / "client.py").write_text("import hpc_train.runs.example\n")  # slurm -> runs is allowed
    _, imports, graph = read_package(package_dir)
    assert graph["hpc_train.runs.example"] == ["hpc_train.local", "hpc_train.local.plan", "hpc_train.slurm",
                                               "hpc_train.slurm.client"]
    assert imports["hpc_train.runs.example"][0] == {"typing"}  # nothing of the package at import time
    assert graph["hpc_train.slurm.client"] == ["hpc_train.runs", "hpc_train.runs.example"]
    assert reaching("runs", ("slurm", "local"), graph) == {
        "hpc_train.runs.example": "hpc_train.runs.example -> hpc_train.local"}


# --------------------------------------------------------------------------------------------------
# The torch line
# --------------------------------------------------------------------------------------------------

TORCH_SIDE = "train"
INTEGRATIONS = "integrations"  # torch-side too (the library it adapts imports torch), outside train/ on purpose
# In train/ but torch-free on purpose: the package itself, the entrypoint (its handlers come first) and the
# public path of the submitit callables, which queued jobs' pickles name.
TRAIN_TORCH_FREE = {"hpc_train.train", "hpc_train.train.__main__", "hpc_train.train.callable"}
# Outside train/, torch is imported only inside these entries, which the user's own code calls on a rank:
# hpc_train.dist.setup() and its helpers.
LAZY_TORCH_ENTRIES = {"hpc_train.rank.dist"}


def _is_torch(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")


def test_nothing_outside_train_imports_torch_or_the_torch_side_at_import_time():
    reaching_torch = {name: sorted(m for m in IMPORTS[name][0] if _is_torch(m) or (m in MODULES and _within(m, TORCH_SIDE)))
                      for name in MODULES if not _within(name, TORCH_SIDE) and not _within(name, INTEGRATIONS)}
    assert {k: v for k, v in reaching_torch.items() if v} == {}, "import these inside the function that needs them"


def test_outside_train_torch_is_imported_only_by_the_lazy_entries():
    lazy = sorted(name for name in MODULES if not _within(name, TORCH_SIDE) and not _within(name, INTEGRATIONS)
                  and any(_is_torch(m) for m in IMPORTS[name][1]))
    assert lazy == sorted(LAZY_TORCH_ENTRIES)


def test_every_module_in_train_imports_torch_or_serves_only_train():
    offenders = {}
    for name in MODULES:
        if not _within(name, TORCH_SIDE) or name in TRAIN_TORCH_FREE or MODULES[name].name == "__init__.py":
            continue  # a package's __init__ runs on the way to its modules: the modules are what is judged
        if any(_is_torch(m) for m in IMPORTS[name][0]):
            continue
        outside = sorted(other for other, (_, anywhere) in IMPORTS.items()
                         if name in anywhere and not _within(other, TORCH_SIDE))
        if outside:
            offenders[name] = outside
    assert offenders == {}, ("torch-free modules used outside train/ belong on the torch-free side "
                             "(rank/, runs/, config/): " + str(offenders))


RANK_SIDE_HEAVY = ("torch", "numpy", "submitit")


def test_rank_side_imports_neither_torch_numpy_nor_submitit():
    # Read from the source (lazy imports included, bar the lazy torch entry) and seen in a fresh interpreter.
    rank_modules = sorted(name for name in MODULES if _within(name, "rank"))
    assert len(rank_modules) >= 7
    written = {name: sorted(m for m in IMPORTS[name][1 if name not in LAZY_TORCH_ENTRIES else 0]
                            if m.split(".")[0] in RANK_SIDE_HEAVY) for name in rank_modules}
    assert {k: v for k, v in written.items() if v} == {}
    code = (f"import sys; import {', '.join(rank_modules)}; "
            f"print(','.join(m for m in {RANK_SIDE_HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


# --------------------------------------------------------------------------------------------------
# Documents the code cites
# --------------------------------------------------------------------------------------------------

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
        if not path.exists():
            continue  # deleted in the working tree, not yet committed
        for name in cited.findall(path.read_text(encoding="utf-8", errors="replace")):
            if name not in known and name != "SKILL.md":
                missing.setdefault(name, path.relative_to(ROOT).as_posix())
    assert not missing, f"cited but not in the repository: {missing}"
