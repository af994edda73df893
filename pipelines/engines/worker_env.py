"""The Python environment of the local cluster's PyFlink workers and of ``flink run -py``'s client:
a virtual environment in the engines cache holding ``pip install '<project>[flink]'``, resolved
from the packages' own metadata (no ``--no-deps``) and checked with ``pip check``.

Built once per Flink version, Python version and project metadata (``pyproject.toml``'s
tables, ``setup.py``); when only the project's code changed, the same ``pip install`` runs again
in it (pip reinstalls a project given by path). A new build removes the environments that older
metadata left for the same versions (about 1.2 GB each), unless a running process uses them.
deploy/README.md, "Try the Flink deployment on one machine", says what it pins.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from renyi_stream.pipelines.engines.errors import ClusterError

DISTRIBUTION = "renyi-stream"
EXTRA = "flink"
#: A checkout's files whose content decides what pip resolves: other content, another environment.
METADATA_FILES = ("pyproject.toml", "setup.py")
#: What a checkout's install is built from, copied first (a build writes build/ and *.egg-info beside its source).
SOURCE_ITEMS = ("pyproject.toml", "setup.py", "README.md", "renyi_stream", "stream", "pipelines", "queries")
#: The distributions whose versions the environment reports: PyFlink, the pins it brings, the project.
REPORTED = ("apache-flink", "apache-beam", "numpy", "pyarrow", "pandas", DISTRIBUTION)
MARKER = "renyi-worker-env.json"  # written last: a folder without it is a build that did not finish


@dataclass(frozen=True)
class WorkerEnv:
    """A built environment: its folder, its interpreter, what pip installed and resolved there."""

    path: Path
    python: Path
    python_version: str
    requirements: tuple[str, ...]
    versions: dict[str, str]  # distribution name -> version, for REPORTED
    build_s: float  # seconds its first build took

    def describe(self) -> dict:
        """The environment as JSON-ready values (for the cluster's state file and ``status``)."""
        return {**asdict(self), "path": str(self.path), "python": str(self.python),
                "requirements": list(self.requirements)}


@dataclass(frozen=True)
class _Source:
    """Where the project comes from: a checkout (``root``) or the index (``requirement``)."""

    root: Path | None
    requirement: str  # the checkout's path with the extra, or ``renyi-stream[flink]==<version>``
    metadata: str  # digest of what decides the resolution
    code: str  # digest of what is installed


def ensure(cache: Path, *, flink_version: str, python: str, project: Path,
           say: Callable[[str], None] = lambda _m: None) -> WorkerEnv:
    """The workers' environment for ``flink_version`` under ``cache/worker-envs``: built with
    ``python`` if missing, the project reinstalled if its code changed, ``pip check`` run every
    time. ``project`` is a checkout (built from a copy of it) or an installed package's folder
    (then ``renyi-stream[flink]`` at the installed version comes from the index)."""
    if not flink_version or any(c.isspace() for c in flink_version):
        raise ValueError(f"flink_version must be a version such as '2.2.0', got flink_version={flink_version!r}")
    python_version = _python_version(python)
    source = _source(project)
    key = _digest([flink_version, python_version, source.metadata])[:12]
    folder = cache / "worker-envs" / f"flink-{flink_version}-py{python_version}-{key}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_name(folder.name + ".lock")):
        recorded = _recorded(folder)
        if recorded is None or recorded["code"] != source.code:
            requirements, took = _build(folder, python, source, flink_version, fresh=recorded is None, say=say)
        else:
            requirements, took = tuple(recorded["requirements"]), 0.0
        check(folder)
        build_s = took if recorded is None else recorded["build_s"]  # the first build's, kept
        env = WorkerEnv(folder, folder / "bin" / "python", python_version, requirements, _versions(folder), build_s)
        (folder / MARKER).write_text(json.dumps({**env.describe(), "code": source.code}, indent=2))
    if recorded is None:
        for stale in _prune(folder):
            say(f"removed {stale} (the PyFlink workers' environment of older project metadata)")
    return env


def _build(folder: Path, python: str, source: _Source, flink_version: str, *, fresh: bool,
           say: Callable[[str], None]) -> tuple[tuple[str, ...], float]:
    """Make ``folder`` a new virtual environment (``fresh``) or keep it, then ``pip install`` the
    project in it; the requirements given to pip and the seconds it all took."""
    started = time.monotonic()
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
        say(f"building the PyFlink workers' environment {folder} (pip install of the project's [{EXTRA}] extra; "
            "about 2 minutes the first time) ...")
        _run([python, "-m", "venv", str(folder)], what=f"python={python!r} -m venv {folder}")
    else:
        say(f"the project's code changed: reinstalling it in {folder} ...")
    requirements = _install(folder, source, flink_version)
    took = round(time.monotonic() - started, 1)
    say(f"the PyFlink workers' environment: done in {took:.0f} s")
    return requirements, took


def check(folder: Path) -> None:
    """``pip check`` in ``folder``'s environment; ClusterError naming each conflict when it fails."""
    done = _run([str(folder / "bin" / "python"), "-m", "pip", "check", "--disable-pip-version-check"],
                what="pip check", quiet=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        raise ClusterError(f"pip check failed in the PyFlink workers' environment {folder}: {'; '.join(lines)}")


def conflict(output: str) -> str:
    """What pip said conflicts: its "The conflict is caused by:" paragraph, else its ERROR lines,
    else the end of its output."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("The conflict is caused by"):
            paragraph = []
            for follow in lines[i + 1:]:
                if not follow.strip():
                    break
                paragraph.append(follow.strip())
            return "; ".join(paragraph)
    errors = [line.strip() for line in lines if line.startswith("ERROR")]
    return " ".join(errors) if errors else output[-1500:].strip()


def _python_version(python: str) -> str:
    """``major.minor`` of the interpreter ``python``; ClusterError when it does not run."""
    try:
        done = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60, env=_clean_env())
    except OSError as exc:
        raise ClusterError(f"python={python!r} does not run: {exc}") from exc
    if done.returncode != 0:
        raise ClusterError(f"python={python!r} does not run (exit status {done.returncode}): {done.stderr[-500:]}")
    return done.stdout.strip()


def _source(project: Path) -> _Source:
    """The project at ``project``: a checkout when it holds ``pyproject.toml``, else the installed distribution."""
    if (project / "pyproject.toml").is_file():
        return _Source(project, f"{project}[{EXTRA}]", _metadata_digest(project), _digest_files(project, SOURCE_ITEMS))
    requirement = f"{DISTRIBUTION}[{EXTRA}]=={importlib.metadata.version(DISTRIBUTION)}"
    return _Source(None, requirement, requirement, requirement)


def _install(folder: Path, source: _Source, flink_version: str) -> tuple[str, ...]:
    """``pip install`` of the project with its extra and ``apache-flink==<flink_version>`` (which
    conflicts, naming why, when the extra pins another); the requirements as given to pip."""
    requirements = (source.requirement, f"apache-flink=={flink_version}")
    with tempfile.TemporaryDirectory(prefix="renyi-worker-env-") as tmp:
        given = list(requirements)
        if source.root is not None:
            copy = Path(tmp) / "project"
            _copy_source(source.root, copy)
            given[0] = f"{copy}[{EXTRA}]"
        done = _run([str(folder / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *given],
                    what="pip install", quiet=True)
    if done.returncode != 0:
        raise ClusterError(f"pip could not install the PyFlink workers' environment {folder} "
                           f"({' '.join(requirements)}): {conflict(done.stdout + done.stderr)}")
    return requirements


def _copy_source(root: Path, target: Path) -> None:
    """Copy what the checkout ``root`` installs from (SOURCE_ITEMS, less caches and build output) to ``target``."""
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCE_ITEMS:
        item = root / name
        if item.is_dir():
            shutil.copytree(item, target / name, ignore=ignore)
        elif item.is_file():
            shutil.copy2(item, target / name)


def _versions(folder: Path) -> dict[str, str]:
    """The installed version of each of REPORTED in ``folder``'s environment ('' when absent)."""
    script = ("import importlib.metadata as m, json, sys\n"
              "def v(n):\n    try:\n        return m.version(n)\n"
              "    except m.PackageNotFoundError:\n        return ''\n"
              "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    done = _run([str(folder / "bin" / "python"), "-c", script, *REPORTED], what="reading versions", quiet=True)
    if done.returncode != 0:
        raise ClusterError(f"the PyFlink workers' environment {folder} does not run: {done.stderr[-500:]}")
    return json.loads(done.stdout)


def _recorded(folder: Path) -> dict | None:
    """What the last finished build recorded, or None (no build, or one that did not finish)."""
    marker = folder / MARKER
    if not marker.exists() or not (folder / "bin" / "python").exists():
        return None
    try:
        return json.loads(marker.read_text())
    except ValueError:
        return None


def _metadata_digest(root: Path) -> str:
    """A digest of what decides pip's resolution in a checkout: ``pyproject.toml``'s tables as
    parsed (a changed comment changes nothing), ``setup.py``'s text; the whole files where Python
    has no ``tomllib`` (3.10)."""
    try:
        import tomllib
    except ImportError:
        return _digest_files(root, METADATA_FILES)
    tables = tomllib.loads((root / "pyproject.toml").read_text())
    setup = root / "setup.py"
    return _digest([json.dumps(tables, sort_keys=True, default=str), setup.read_text() if setup.exists() else ""])


def _prune(folder: Path) -> list[Path]:
    """Remove the other environments of ``folder``'s Flink and Python versions (built for older
    project metadata) that no running process uses; those removed."""
    prefix = folder.name.rsplit("-", 1)[0] + "-"
    removed = []
    for other in sorted(folder.parent.glob(prefix + "*")):
        if other != folder and other.is_dir() and not _in_use(other):
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed


def _in_use(folder: Path) -> bool:
    """Whether a running process's command line names ``folder`` (a PyFlink worker, a client)."""
    needle = str(folder).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    return True
    return False


def _digest(parts: Sequence[str]) -> str:
    """One SHA-256 hex digest of ``parts``."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _digest_files(root: Path, items: Sequence[str]) -> str:
    """One digest of the files ``items`` name under ``root`` (folders recursively, less caches)."""
    digest = hashlib.sha256()
    for name in items:
        item = root / name
        files = sorted(p for p in item.rglob("*") if p.is_file()) if item.is_dir() else [item] if item.is_file() else []
        for path in files:
            relative = path.relative_to(root)
            if "__pycache__" in relative.parts or path.suffix == ".pyc" or any(
                    part.endswith(".egg-info") for part in relative.parts):
                continue
            digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _clean_env() -> dict[str, str]:
    """This process's environment less what would make another interpreter import our modules."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(cmd: Sequence[str], *, what: str, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run ``cmd`` outside this process's PYTHONPATH, output captured; a failure is a ClusterError unless ``quiet``."""
    done = subprocess.run(list(cmd), text=True, stdin=subprocess.DEVNULL, capture_output=True, env=_clean_env())
    if done.returncode != 0 and not quiet:
        raise ClusterError(f"{what} failed (exit status {done.returncode}): {(done.stdout + done.stderr)[-1500:]}")
    return done


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build of a folder at a time (two clusters, or a cluster and a test run, may share a cache)."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
