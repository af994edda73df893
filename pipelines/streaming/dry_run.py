"""What a dry run (``--dry-run``) of the streaming job shares with the job it previews, under any
runner: the private scratch copy of the release root and of ``--output`` it runs into
(:func:`_private_copy`), and the release root the ledger's snapshots record read as that copy
(:data:`_PREVIEWED_ROOT`). Imports no Beam."""

from __future__ import annotations

import contextvars
import os
from pathlib import Path, PurePosixPath

import pyarrow.fs as pafs

from renyi_stream.queries.release_files import filesystem
from renyi_stream.stream.private_files import make_private_dirs

#: During a dry run (the Beam shell's ``dry_run``) only: ``(the real release root, its scratch copy)``. The
#: ledger's snapshots record the root it answers into, which the real run checks; the preview
#: answers into the copy and reads the recorded root as the copy, so it passes where the real run
#: passes and is refused where the real run is refused.
_PREVIEWED_ROOT: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("previewed_root",
                                                                                       default=None)


def _previewed(root: str) -> str:
    """``root``, or its scratch copy during a dry run of the job releasing under it."""
    previewed = _PREVIEWED_ROOT.get()
    return previewed[1] if previewed is not None and root == previewed[0] else root


def _private_copy(source: str, destination: Path) -> bool:
    """Copy the folder ``source`` (a local path or a URI pyarrow reaches) to the local
    ``destination`` as curator files: every folder made ``0700``, every file created ``0600``
    from its first byte (``O_CREAT | O_EXCL``), whatever the umask; False, nothing copied, when
    there is no such folder. A dry run's scratch copy of ``--output`` is then what the job's
    own files are, so the preview of a restart reads it as the restart reads the real folder,
    instead of refusing its own copy as loose (issue 37). A local file that group or others may
    read keeps that mode in the copy (inside the ``0700`` scratch folder nobody else may enter):
    the preview refuses it as the real job refuses the real file, naming the real path and mode."""
    source_fs, where = filesystem(source)
    if source_fs.get_file_info(where).type != pafs.FileType.Directory:
        return False
    local = isinstance(source_fs, pafs.LocalFileSystem)
    make_private_dirs(destination)
    os.chmod(destination, 0o700)
    entries = source_fs.get_file_info(pafs.FileSelector(where, recursive=True))
    for entry in sorted(entries, key=lambda e: e.path):
        target = destination / PurePosixPath(entry.path).relative_to(PurePosixPath(where))
        if entry.type == pafs.FileType.Directory:
            make_private_dirs(target)
        elif entry.type == pafs.FileType.File:
            make_private_dirs(target.parent)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as sink, source_fs.open_input_stream(entry.path) as stream:
                while chunk := stream.read(1 << 20):
                    sink.write(chunk)
            loose = os.stat(entry.path).st_mode & 0o077 if local else 0
            if loose:
                os.chmod(target, 0o600 | loose)
    return True

