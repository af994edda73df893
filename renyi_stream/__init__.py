"""renyi-stream's one import package.

The repository keeps its architecture as three top-level folders (``stream/`` the Beam-free
privacy core, ``pipelines/`` the jobs, ``queries/`` the analysts' side; docs/architecture.md,
"Layout"); an install maps them under this package (pyproject.toml, ``package-dir``), so that
``pip install`` puts one name of our own in site-packages, ``renyi_stream``, and never a generic
``stream``, ``pipelines`` or ``queries`` that another distribution also installs (issue 31).

Imported from a checkout rather than an install (``PYTHONPATH=<checkout>``, as a Beam worker
pool started beside the checkout does), this folder holds only this file: the checkout's root is
then added to the package's path, so ``renyi_stream.stream`` is ``<checkout>/stream``, the same
modules an editable install maps.
"""

from __future__ import annotations

import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "stream")) and _os.path.isfile(
        _os.path.join(_checkout, "stream", "__init__.py")):
    __path__.append(_checkout)  # noqa: F821 (a package's __path__, set by the import system)
