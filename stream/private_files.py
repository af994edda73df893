"""Curator files are private: created ``0600`` in ``0700`` folders, refused when others can read them.

The curator's files hold what invariant 4 (nothing-pre-noise-leaves, docs/architecture.md) keeps
from everyone else: per-user used budgets and trackers (the ledger database and its snapshots),
running-query histories, exact row counts, raw dead-letter rows and one row of features per user.
They are as sensitive as the noise key (:class:`renyi_stream.stream.noise.NoiseKey`), and are handled the
same way, whatever the umask:

* a curator file is created with mode ``0600`` from its first byte (``O_CREAT | O_EXCL`` with
  that mode, then written and renamed into place: :func:`write_private`); a library that
  creates its own files (DuckDB, its write-ahead log included) runs under
  :func:`private_umask`; files written by someone else's code (Beam's Parquet sinks) are
  tightened by :func:`tighten_tree` before the run commits; a file written whole goes first to a
  scratch file beside it, ``.<name>.<pid>-<random>.tmp``, created ``0600`` (:func:`private_scratch`),
  which a failure removes and a killed process leaves private (the next writer of the same file
  removes those of processes that are gone);
* a library's temporary files about a curator file (DuckDB spills a large sort or join of the
  ledger to disk) go to ``<file>.tmp/``, a ``0700`` folder created race-free and checked to be a
  real folder of ours that nobody else may enter (:func:`private_temp_dir`);
* a job's scratch folder in the system temp dir (the daily job stages the previous ledger there
  for its pipeline) is ``<prefix><pid>-<random>``, ``0700``, removed when the run ends
  (:func:`private_run_dir`); one a killed run left is removed by the next run of any job with
  that prefix, once its process is gone (:func:`remove_stale_run_dirs`);
* a folder created for curator files is ``0700`` (:func:`make_private_dirs`, each missing
  level, ``chmod``-ed so that the umask cannot loosen it). A folder that is the curator's own by
  contract (a distributed run's ``--output``, the demo's ``curator/``) is tightened to ``0700``
  when it already exists (:func:`private_dir`): it holds nothing but curator files, so nobody
  loses access they should have, and a re-run must not be refused for a folder an older version
  made. A folder merely *named* by a path (the ledger's folder, the working directory, a home
  directory) is left as it is: it may be shared, and the files in it are private;
* an existing curator file with any group/other permission bit (``mode & 0o077``) is refused
  before it is opened (:func:`refuse_if_shared`), naming the file and the fix, as a loose key
  is: it may already have been read, which only the curator can judge, so it is never silently
  tightened.

Only local paths are covered. For ``gs://`` and ``s3://`` object permissions are the bucket's
IAM policy, which this module cannot see or set: give curator outputs a bucket (or prefix) that
only the curator's service accounts can read.

The public release store (``releases.duckdb``) and public release Parquet files are not
curator files: they keep the caller's umask.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import shutil
import stat
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

T = TypeVar("T")
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
#: What a summary that carries exact counts says first: invariant 4 (nothing-pre-noise-leaves,
#: docs/architecture.md).
CURATOR_ONLY_NOTICE = "curator only: exact counts, do not publish (--quiet prints none)"


class PrivateFileError(ValueError):
    """A curator file (or folder) that group or others may read or write."""


def refuse_if_shared(path: str | os.PathLike, what: str) -> None:
    """Raise :class:`PrivateFileError` when ``path`` exists and has any group/other permission
    bit; a missing path passes (it will be created private). ``what`` names the file for the
    message (``"the ledger"``), which opens with it, gives the mode and the fix
    (``chmod 600 PATH``)."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    _refuse_mode(path, info, what)


def _refuse_mode(path: Path, info: os.stat_result, what: str) -> None:
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        fix = "700" if stat.S_ISDIR(info.st_mode) else "600"
        raise PrivateFileError(
            f"{what} {path} is accessible to group/others (mode {mode:04o}), but it holds curator-only data "
            f"(per-user data or exact counts): run 'chmod {fix} {path}', and check who may have read it")


def make_private_dirs(path: str | os.PathLike) -> Path:
    """Create the folder ``path`` and every missing parent with mode ``0700`` (``chmod``-ed after
    ``mkdir``, so the umask cannot loosen them). Folders that already exist are left as they are
    (see the module docstring). Returns ``path``."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:  # a concurrent creator: tighten it all the same, it is new
            pass
        os.chmod(folder, PRIVATE_DIR_MODE)
    return path


def private_dir(path: str | os.PathLike) -> Path:
    """A folder that holds only curator files: created as :func:`make_private_dirs` does, and
    ``chmod 0700`` when it already exists. Returns ``path``."""
    path = make_private_dirs(path)
    os.chmod(path, PRIVATE_DIR_MODE)
    return path


def write_private(path: str | os.PathLike, write: Callable[[BinaryIO], None], *, make_parents: bool = True) -> Path:
    """Write the file ``path`` whole or not at all, mode ``0600`` from its creation.

    ``write`` gets a binary file object to write to (``lambda f: pq.write_table(table, f)``).
    The bytes go to a scratch file beside ``path``, created ``O_CREAT | O_EXCL`` with mode
    ``0600``, flushed and fsynced, then renamed over ``path``; missing parent folders are
    created ``0700`` (with ``make_parents=False`` a missing folder is an OSError, as for
    ``open``). A crash leaves the old file (or none) and at worst a private scratch file; any
    error removes the scratch file and is raised.
    """
    path = Path(path)
    if make_parents:
        make_private_dirs(path.parent)
    scratch, fd = _new_scratch(path)
    try:
        try:
            with os.fdopen(fd, "wb", closefd=False) as handle:
                write(handle)
            os.fsync(fd)  # durable before it is renamed into place
        finally:
            os.close(fd)
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    return path


def write_private_bytes(path: str | os.PathLike, data: bytes, *, make_parents: bool = True) -> Path:
    """:func:`write_private` of ``data``."""
    return write_private(path, lambda handle: handle.write(data), make_parents=make_parents)


def _scratch_pattern(path: Path) -> re.Pattern[str]:
    """The names of ``path``'s scratch files (:func:`_new_scratch`), the writer's pid as group 1."""
    return re.compile(rf"\.{re.escape(path.name)}\.([0-9]+)-[0-9a-f]{{32}}\.tmp")


def _new_scratch(path: Path) -> tuple[Path, int]:
    """A new empty scratch file beside ``path``, ``.<name>.<pid>-<random>.tmp``, created
    ``O_CREAT | O_EXCL`` with mode ``0600`` (``fchmod``-ed, as a umask such as ``0o277`` would
    leave it unwritable): its path and an open descriptor for writing."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        scratch.unlink(missing_ok=True)
        raise
    return scratch, fd


@contextlib.contextmanager
def private_scratch(path: str | os.PathLike) -> Iterator[Path]:
    """A new empty file to write ``path`` through, for code that writes by name (``np.savez``):
    ``.<name>.<pid>-<random>.tmp`` beside ``path``, created ``0600`` whatever the umask; the
    block writes it and moves it into place (``os.replace``). Whatever the block does not move is
    removed when it ends, on any exception (``KeyboardInterrupt`` included) too; a process killed
    in the block leaves it, ``0600``. Scratch files of ``path`` left by processes that are gone
    are removed first (:func:`remove_stale_scratch`). The folder must exist."""
    path = Path(path)
    remove_stale_scratch(path)
    scratch, fd = _new_scratch(path)
    os.close(fd)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)


def remove_stale_scratch(path: str | os.PathLike) -> list[Path]:
    """Remove the scratch files of ``path`` (:func:`private_scratch`, :func:`write_private`)
    whose writing process no longer exists (killed mid-write); those of live processes, and
    files of other names or owners, are left. Returns the paths removed."""
    path = Path(path)
    pattern = _scratch_pattern(path)
    removed = []
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return removed
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or process_alive(int(match.group(1))):
            continue
        stale = path.parent / name
        try:
            if stale.lstat().st_uid != os.geteuid():
                continue
            stale.unlink()
        except FileNotFoundError:
            continue
        removed.append(stale)
    return removed


@contextlib.contextmanager
def private_run_dir(prefix: str, parent: str | os.PathLike | None = None) -> Iterator[Path]:
    """A new scratch folder for one run, ``<prefix><pid>-<random>`` in ``parent`` (the system temp
    dir by default), ``0700`` whatever the umask, removed with everything in it when the block
    ends (on an exception too). A process killed in the block leaves it, private; the folders of
    ``prefix`` that killed processes left are removed first (:func:`remove_stale_run_dirs`)."""
    remove_stale_run_dirs(prefix, parent)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-", dir=parent) as folder:
        os.chmod(folder, PRIVATE_DIR_MODE)  # mkdtemp's 0700 less a umask such as 0o277 is unwritable
        yield Path(folder)


def remove_stale_run_dirs(prefix: str, parent: str | os.PathLike | None = None) -> list[Path]:
    """Remove the scratch folders ``<prefix><pid>-*`` of :func:`private_run_dir` in ``parent`` (the
    system temp dir by default) whose process no longer exists (a killed run). Those of live
    processes, those of other users, symbolic links and names without a pid are left. Returns
    the folders removed."""
    parent = Path(tempfile.gettempdir() if parent is None else parent)
    pattern = re.compile(rf"{re.escape(prefix)}([0-9]+)-.+")
    removed = []
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        match = pattern.fullmatch(name)
        if match is None or process_alive(int(match.group(1))):
            continue
        stale = parent / name
        try:
            info = stale.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        shutil.rmtree(stale, ignore_errors=True)  # another run may be removing it too
        if not os.path.lexists(stale):
            removed.append(stale)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts: it exists; an id beyond
    what the system's process ids hold is none)."""
    try:
        os.kill(pid, 0)
    except OverflowError:
        return False
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def public_file_mode() -> int:
    """The mode a new public file gets, ``0o666`` less the caller's umask (what ``open`` gives),
    for a file written privately and then published (a released model). Read under the lock of
    :func:`private_umask`, so a block in progress does not make it private."""
    with _umask_lock:
        if _umask_depth:
            mask = _umask_saved
        else:  # reading the umask sets it: set a stricter one meanwhile, never a looser one
            mask = os.umask(0o077)
            os.umask(mask)
    return 0o666 & ~mask


def private_temp_dir(path: str | os.PathLike) -> Path:
    """The folder ``<path>.tmp`` for a library's temporary files about the curator file ``path``
    (DuckDB's spill files; its own default place, which it would create with the umask's modes).

    Created ``0700`` (``mkdir`` under :func:`private_umask`, then ``fchmod``), so it is never
    open to others, even for a moment. An existing one is used only if it is a real folder (not a
    link), owned by this user, with no group/other permission bit; otherwise
    :class:`PrivateFileError` naming it and the fix, as for a shared curator file: what was
    spilled there may already have been read. The folder is kept (empty once the library is
    done), so that every connection to ``path`` uses the same one."""
    folder = Path(f"{path}.tmp")
    what = "the temporary folder"
    with private_umask():
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
            created = True
        except FileExistsError:
            created = False
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        raise PrivateFileError(
            f"{what} {folder} is not a folder but a file or a symbolic link, and temporary files of curator-only "
            f"data must not go where it points: remove it ('rm {folder}') and check who made it") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise PrivateFileError(
                f"{what} {folder} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): its owner "
                f"could read the curator-only data spilled there; remove it and check who made it")
        if created:
            os.fchmod(fd, PRIVATE_DIR_MODE)  # a umask such as 0o277 would leave it unwritable
            info = os.fstat(fd)
        _refuse_mode(folder, info, what)
    finally:
        os.close(fd)
    return folder


_umask_lock = threading.Lock()
_umask_depth = 0
_umask_saved = 0


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Run the block with the process umask ``0o077`` added, so that a library creating its own
    files (DuckDB's database and write-ahead log, a Parquet writer) creates them ``0600`` and
    its folders ``0700``.

    The umask is per process: nested and concurrent blocks share one saved value (a counter
    under a lock), so the caller's umask comes back only when the last block ends and a block
    never runs with a looser mask. Another thread that creates a file while a block runs gets a
    stricter mode than it asked for, never a looser one: so keep blocks around the curator's own
    writes, never around the publication of public files."""
    global _umask_depth, _umask_saved
    with _umask_lock:
        if _umask_depth == 0:
            _umask_saved = os.umask(0o077)
            os.umask(_umask_saved | 0o077)
        _umask_depth += 1
    try:
        yield
    finally:
        with _umask_lock:
            _umask_depth -= 1
            if _umask_depth == 0:
                os.umask(_umask_saved)


def under_private_umask(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` run under :func:`private_umask` (a decorator, for methods that write
    through a library which creates files itself, as DuckDB creates its write-ahead log)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with private_umask():
            return function(*args, **kwargs)

    return wrapper


def tighten_tree(root: str | os.PathLike) -> None:
    """``chmod 0700`` ``root`` and every folder under it, ``chmod 0600`` every regular file;
    symbolic links are neither followed nor changed. For curator outputs written by code that
    does not take a mode (Beam's file sinks). A missing ``root`` is nothing to do."""
    root = Path(root)
    if not root.is_dir():
        return
    os.chmod(root, PRIVATE_DIR_MODE)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, PRIVATE_DIR_MODE)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, PRIVATE_FILE_MODE)
