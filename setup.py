"""The one part of the build pyproject.toml cannot say: install the repository's three top-level
folders as subpackages of one import package, ``renyi_stream`` (renyi_stream/__init__.py says
why), so that nothing but ``renyi_stream`` lands at the top of site-packages
(tests/test_packaging.py builds the wheel and checks it)."""

from setuptools import find_packages, setup

FOLDERS = ("stream", "pipelines", "queries")
SUBPACKAGES = find_packages(include=[name for folder in FOLDERS for name in (folder, f"{folder}.*")])

setup(
    packages=["renyi_stream", *(f"renyi_stream.{name}" for name in SUBPACKAGES)],
    package_dir={f"renyi_stream.{folder}": folder for folder in FOLDERS},
)
