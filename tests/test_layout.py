"""The package layout is the architecture (docs/architecture.md, "Layout"): these tests fail when
an import crosses a layer the wrong way or closes a cycle, at module level or inside a function."""

from __future__ import annotations

import ast
import subprocess
import sys
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
                                    "pipelines/curator", "pipelines/cli", "pipelines/beam", "stream/engine",
                                    "pipelines/streaming/beam", "pipelines/streaming/flink"])
def test_each_part_of_the_layout_is_a_package_that_says_what_it_holds(folder):
    init = ROOT / folder / "__init__.py"
    assert init.exists() and ast.get_docstring(ast.parse(init.read_text()))


# --- the streaming job: one machinery, a thin shell per runner (issue 38, item 2) -------------------

STREAMING = "renyi_stream.pipelines.streaming"
#: The streaming job's runner shells, each a sub-package of pipelines/streaming beside the others.
RUNNER_SHELLS = ("beam", "flink")
#: The streaming job's runner-independent modules: every module of pipelines/streaming but its
#: runner shells and ``__main__`` (which starts the Beam shell's ``main``).
STREAMING_SHARED = sorted(name for name in MODULES if name.startswith(STREAMING + ".")
                          and name.split(".")[3] not in (*RUNNER_SHELLS, "__main__"))
MOST_LINES = 800


def _resolved(targets: list[str]) -> set[str]:
    """``targets`` as :func:`_imports` resolves them: the longest known module, else the package."""
    found = set()
    for target in targets:
        parts = target.split(".")
        while parts and ".".join(parts) not in MODULES:
            parts.pop()
        found.add(".".join(parts) if parts else target.split(".")[0])
    return found


def _import_time_imports(name: str) -> set[str]:
    """What importing ``name`` imports: its statements outside function bodies (module level,
    ``try``/``if`` blocks, class bodies), resolved as :func:`_imports` resolves them. A function's
    own imports run only when it is called."""
    found: set[str] = set()
    todo = list(ast.parse(MODULES[name].read_text(), filename=str(MODULES[name])).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found |= _resolved([alias.name for alias in node.names])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= _resolved([f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES
                                else node.module for alias in node.names])
        todo.extend(ast.iter_child_nodes(node))
    found.discard(name)
    return found


def _closure(name: str) -> set[str]:
    """Every module importing ``name`` imports, directly or through the project's modules."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        for imported in _import_time_imports(current) if current in MODULES else ():
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return seen


def test_the_streaming_jobs_machinery_imports_no_beam_and_no_runner_shell_even_through_other_modules():
    assert len(STREAMING_SHARED) >= 10  # the codec, the commit protocol, recovery, snapshots, books ...
    shells = tuple(f"{STREAMING}.{shell}" for shell in RUNNER_SHELLS)
    found = {name: sorted(i for i in _closure(name) if i == "apache_beam" or i.startswith(shells))
             for name in STREAMING_SHARED}
    assert {name: imports for name, imports in found.items() if imports} == {}
    # Anywhere in their own bodies too: a runner's API is its shell's, never the machinery's.
    direct = {name: sorted(i for i in GRAPH[name] if i == "apache_beam" or i.startswith(shells))
              for name in STREAMING_SHARED}
    assert {name: imports for name, imports in direct.items() if imports} == {}


_BEAM_BLOCKED = """
import importlib, sys

class NoBeam:
    def find_spec(self, name, path=None, target=None):
        if name == "apache_beam" or name.startswith("apache_beam."):
            raise ImportError(f"import of {name} blocked: this module must run without Beam")
        return None

sys.meta_path.insert(0, NoBeam())
for name in sys.argv[1:]:
    importlib.import_module(name)
assert not [m for m in sys.modules if m.split(".")[0] == "apache_beam"]
print("imported", len(sys.argv) - 1)
"""


def test_the_streaming_jobs_machinery_imports_where_importing_beam_fails():
    """Run, not read: each runner-independent module imports in a process where ``import
    apache_beam`` raises (a PyFlink job imports them beside another Beam, or none)."""
    done = subprocess.run([sys.executable, "-c", _BEAM_BLOCKED, *STREAMING_SHARED], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"imported {len(STREAMING_SHARED)}"


def test_no_file_of_the_streaming_job_is_longer_than_800_lines():
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
               for path in sorted((ROOT / "pipelines" / "streaming").rglob("*.py"))}
    assert lengths and {path: n for path, n in lengths.items() if n > MOST_LINES} == {}
