"""The package layout is the architecture (docs/architecture.md, "Layout"): these tests fail when
an import crosses a layer the wrong way or closes a cycle, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stream", "pipelines", "queries")
PACKAGE = "renyi_stream"  # the one import package the folders are installed under (setup.py)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every absolute module ``name`` imports, anywhere in its body (function-level imports too),
    resolved to the longest known module (``from renyi_stream.pipelines.beam import transforms`` imports
    ``renyi_stream.pipelines.beam.transforms``); external modules by their top-level package."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from package import submodule`` imports the submodule; ``from module import name``
            # imports the module
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in MODULES:
                parts.pop()
            found.add(".".join(parts) if parts else target.split(".")[0])
    found.discard(name)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _layer_violations(importer_prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} imports {i}" for m, imported in GRAPH.items()
                  if m == importer_prefix or m.startswith(importer_prefix + ".")
                  for i in imported if any(i == f or i.startswith(f + ".") for f in forbidden))


def _bare_imports(path: Path) -> list[str]:
    """The absolute imports in ``path`` of one of the folders by its bare name (``import stream``,
    ``from pipelines.cli import main``), which only a checkout on ``sys.path`` resolves."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = [(node.lineno, alias.name) for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names]
    names += [(node.lineno, node.module) for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module]
    return [f"{path.relative_to(ROOT)}:{line} imports {name}" for line, name in names
            if name.split(".")[0] in PACKAGES]


def test_every_module_imports_the_folders_through_the_one_installed_package():
    """An installed wheel has no top-level ``stream``, ``pipelines`` or ``queries`` (issue 31):
    a bare import of one works in a checkout and fails after ``pip install .``."""
    tracked = [p for p in ROOT.rglob("*.py") if not any(part.startswith(".") or part in {"build", "dist"}
                                                          for part in p.relative_to(ROOT).parts)]
    assert [found for path in tracked for found in _bare_imports(path)] == []


def test_the_core_and_the_engine_import_nothing_from_the_jobs_or_the_analysts_side():
    assert _layer_violations("renyi_stream.stream", ("renyi_stream.pipelines", "renyi_stream.queries")) == []


def test_the_core_imports_nothing_from_the_engine_above_it():
    core = [m for m in GRAPH if m.startswith("renyi_stream.stream") and not m.startswith("renyi_stream.stream.engine")]
    assert sorted(f"{m} imports {i}" for m in core for i in GRAPH[m] if i.startswith("renyi_stream.stream.engine")) == []


def test_the_engine_is_beam_free_and_storage_free():
    assert _layer_violations("renyi_stream.stream.engine", ("apache_beam", "duckdb")) == []


def test_the_analysts_side_imports_nothing_from_the_pipelines():
    assert _layer_violations("renyi_stream.queries", ("renyi_stream.pipelines",)) == []


def test_no_job_imports_another_job():
    jobs = ("renyi_stream.pipelines.daily", "renyi_stream.pipelines.distributed", "renyi_stream.pipelines.streaming", "renyi_stream.pipelines.features")
    crossings = [v for job in jobs for v in _layer_violations(job, tuple(j for j in jobs if j != job))]
    assert crossings == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative enough for ~100)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back_through_others():
    assert _cycles() == []


@pytest.mark.parametrize("folder", ["pipelines/daily", "pipelines/distributed", "pipelines/streaming", "pipelines/features",
                                    "pipelines/curator", "pipelines/cli", "pipelines/beam", "stream/engine"])
def test_each_part_of_the_layout_is_a_package_that_says_what_it_holds(folder):
    init = ROOT / folder / "__init__.py"
    assert init.exists() and ast.get_docstring(ast.parse(init.read_text()))
