"""Fixtures shared by the test files: the curator-file privacy checks (issue 18, item 5)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture
def umask_022():
    """The common default umask for the test (group and others may read new files), restored after."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _not_private(root: Path) -> dict[str, str]:
    """What under ``root`` (itself included) is not 0700 (folders) or 0600 (files), with its mode."""
    paths = [root, *root.rglob("*")]
    return {str(p.relative_to(root)): f"{stat.S_IMODE(p.stat().st_mode):04o}" for p in paths
            if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)}


@pytest.fixture
def not_private() -> Callable[[Path], dict[str, str]]:
    """``not_private(root)``: what under ``root`` is not private, as ``{relative path: mode}``."""
    return _not_private
