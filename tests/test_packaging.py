"""What ``pip install .`` puts in site-packages (issue 31): one import package of our own,
``renyi_stream``, holding the repository's three folders, and nothing at the top level that another
distribution also installs (``stream`` is stream-python's import name, ``queries`` a PostgreSQL
client's)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("stream", "pipelines", "queries")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip install .`` would install, built offline from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                            "--quiet", "--wheel-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("renyi_stream-*.whl")
    return found


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_installs_one_top_level_package_and_its_metadata(wheel):
    top = {name.split("/")[0] for name in _names(wheel)}
    assert {name for name in top if not name.endswith(".dist-info")} == {"renyi_stream"}
    assert len(top) == 2


def test_the_wheel_holds_every_module_of_the_three_folders_under_the_package(wheel):
    tracked = subprocess.run(["git", "ls-files", *FOLDERS], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    expected = {f"renyi_stream/{path}" for path in tracked if path.endswith(".py")}
    assert expected and expected <= set(_names(wheel))


def test_the_console_script_starts_the_cli_inside_the_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode()
    assert "renyi-stream = renyi_stream.pipelines.cli.main:main" in text


def test_the_installed_wheel_runs_without_the_checkout(wheel, tmp_path):
    """Installed alone (no checkout on the path, run from elsewhere), the CLI imports and answers."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    code = ("import renyi_stream, renyi_stream.pipelines.cli.main as cli; "
            "print(renyi_stream.__file__); print(cli.__file__)")
    shown = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "HOME": str(tmp_path)})
    assert shown.returncode == 0, shown.stderr
    assert all(line.startswith(str(target)) for line in shown.stdout.split())
    assert not (target / "stream").exists() and not (target / "pipelines").exists()


def test_a_checkout_on_the_path_imports_the_same_package_from_its_folders(tmp_path):
    """A Beam worker pool started beside a checkout (``PYTHONPATH=<checkout>``, no install) resolves
    ``renyi_stream.stream`` to the checkout's ``stream/`` (renyi_stream/__init__.py)."""
    code = "import renyi_stream.stream, renyi_stream.queries; print(renyi_stream.stream.__file__)"
    shown = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == str(ROOT / "stream" / "__init__.py")
