"""renyi_stream.stream.private_files: curator files 0600 in 0700 folders whatever the umask, refused when shared."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import uuid

import pytest

from renyi_stream.stream.private_files import (PrivateFileError, make_private_dirs, private_dir, private_run_dir, private_scratch,
                                  private_temp_dir, private_umask, public_file_mode, refuse_if_shared,
                                  remove_stale_run_dirs, remove_stale_scratch, tighten_tree, write_private,
                                  write_private_bytes)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_write_private_creates_the_file_0600_and_its_missing_folders_0700(tmp_path, umask_022):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    target = shared / "a" / "b" / "f.bin"
    write_private_bytes(target, b"secret")
    assert target.read_bytes() == b"secret"
    assert (_mode(target), _mode(shared / "a"), _mode(shared / "a" / "b")) == (0o600, 0o700, 0o700)
    assert _mode(shared) == 0o755  # a folder that existed is not the helper's to change


def test_write_private_gives_0600_even_under_a_umask_that_masks_the_owners_write_bit(tmp_path):
    old = os.umask(0o277)
    try:
        write_private_bytes(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f") == 0o600


def test_write_private_replaces_whole_or_not_at_all_and_leaves_no_scratch_file(tmp_path):
    target = tmp_path / "f"
    write_private_bytes(target, b"old")

    def fail(handle):
        handle.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_private(target, fail)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_write_private_without_make_parents_refuses_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_private_bytes(tmp_path / "no" / "f", b"x", make_parents=False)
    assert not (tmp_path / "no").exists()


def test_private_dir_tightens_an_existing_folder_make_private_dirs_does_not(tmp_path):
    (tmp_path / "ours").mkdir(mode=0o755)
    (tmp_path / "named").mkdir(mode=0o755)
    os.chmod(tmp_path / "ours", 0o755)
    os.chmod(tmp_path / "named", 0o755)
    private_dir(tmp_path / "ours")
    make_private_dirs(tmp_path / "named")
    assert (_mode(tmp_path / "ours"), _mode(tmp_path / "named")) == (0o700, 0o755)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o610])
def test_a_file_with_any_group_or_other_bit_is_refused_naming_it_the_mode_and_the_fix(tmp_path, mode):
    path = tmp_path / "ledger.duckdb"
    path.write_bytes(b"")
    os.chmod(path, mode)
    with pytest.raises(PrivateFileError) as caught:
        refuse_if_shared(path, "the ledger")
    message = str(caught.value)
    assert message.startswith(f"the ledger {path} ") and f"mode {mode:04o}" in message
    assert f"chmod 600 {path}" in message


def test_a_private_or_missing_file_passes(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    os.chmod(path, 0o600)
    refuse_if_shared(path, "the ledger")
    refuse_if_shared(tmp_path / "missing", "the ledger")


def test_private_umask_masks_group_and_other_and_restores_the_callers_after_nesting(tmp_path, umask_022):
    with private_umask():
        with private_umask():
            (tmp_path / "inner").write_bytes(b"")
        (tmp_path / "outer").write_bytes(b"")  # the inner block's end must not restore 022 yet
        assert _umask() == 0o077
    assert _umask() == 0o022
    assert (_mode(tmp_path / "inner"), _mode(tmp_path / "outer")) == (0o600, 0o600)


def test_private_umask_overlapping_in_threads_restores_the_callers_only_at_the_last_end(umask_022):
    entered, release = threading.Event(), threading.Event()

    def other():
        with private_umask():
            entered.set()
            release.wait(5)

    worker = threading.Thread(target=other)
    with private_umask():
        worker.start()
        entered.wait(5)
    assert _umask() == 0o077  # the other thread's block is still open
    release.set()
    worker.join(5)
    assert _umask() == 0o022


def test_tighten_tree_makes_folders_0700_and_files_0600_and_leaves_links(tmp_path, umask_022):
    root = tmp_path / "out"
    (root / "ledger" / "a").mkdir(parents=True)
    (root / "ledger" / "a" / "part-0.parquet").write_bytes(b"")
    (root / "_COMMITTED.json").write_bytes(b"{}")
    outside = tmp_path / "public.parquet"
    outside.write_bytes(b"")
    (root / "link").symlink_to(outside)
    tighten_tree(root)
    assert {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")] if not p.is_symlink()} == {
        ".": 0o700, "ledger": 0o700, "ledger/a": 0o700, "ledger/a/part-0.parquet": 0o600, "_COMMITTED.json": 0o600}
    assert _mode(outside) == 0o644  # a link's target is not the tree's


# --- temporaries (issue 28, item 4) ---------------------------------------------------------------


def test_private_temp_dir_is_made_0700_under_umask_022_and_the_same_folder_is_used_again(tmp_path, umask_022):
    folder = private_temp_dir(tmp_path / "l.duckdb")
    assert folder == tmp_path / "l.duckdb.tmp" and _mode(folder) == 0o700
    assert private_temp_dir(tmp_path / "l.duckdb") == folder


def test_private_temp_dir_is_0700_even_under_a_umask_that_masks_the_owners_write_bit(tmp_path):
    old = os.umask(0o277)
    try:
        folder = private_temp_dir(tmp_path / "l.duckdb")
    finally:
        os.umask(old)
    assert _mode(folder) == 0o700


def test_private_temp_dir_refuses_a_symbolic_link_naming_it(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "l.duckdb.tmp").symlink_to(elsewhere)
    with pytest.raises(PrivateFileError, match=f"{tmp_path / 'l.duckdb.tmp'} is not a folder"):
        private_temp_dir(tmp_path / "l.duckdb")


def test_private_temp_dir_refuses_a_folder_of_another_user(tmp_path, monkeypatch):
    (tmp_path / "l.duckdb.tmp").mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as if someone else had made it
    with pytest.raises(PrivateFileError, match="not to this user"):
        private_temp_dir(tmp_path / "l.duckdb")


def _scratch_files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_private_scratch_is_0600_under_umask_022_and_moved_into_place(tmp_path, umask_022):
    target = tmp_path / "m.npz"
    with private_scratch(target) as scratch:
        assert scratch.parent == tmp_path and scratch.name.startswith(".m.npz.") and _mode(scratch) == 0o600
        scratch.write_bytes(b"model")
        os.replace(scratch, target)
    assert target.read_bytes() == b"model" and _scratch_files(tmp_path) == []


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_private_scratch_is_removed_when_the_block_fails(tmp_path, failure):
    with pytest.raises(type(failure)):
        with private_scratch(tmp_path / "m.npz") as scratch:
            scratch.write_bytes(b"half")
            raise failure
    assert list(tmp_path.iterdir()) == []


def test_remove_stale_scratch_removes_those_of_processes_that_are_gone_only(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    stale = tmp_path / f".m.npz.{int(gone.stdout)}-{uuid.uuid4().hex}.tmp"
    live = tmp_path / f".m.npz.{os.getppid()}-{uuid.uuid4().hex}.tmp"  # pytest's parent is running
    other = tmp_path / f".other.npz.{int(gone.stdout)}-{uuid.uuid4().hex}.tmp"
    for path in (stale, live, other, tmp_path / "m.npz.tmp"):
        path.write_bytes(b"")
    assert remove_stale_scratch(tmp_path / "m.npz") == [stale]
    assert _scratch_files(tmp_path) == sorted([live.name, other.name, "m.npz.tmp"])


def _dead_pid() -> int:
    """The id of a process that has exited (and been waited for)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    return int(gone.stdout)


def _run_dir(parent, pid: int, secret: bytes = b"per-user rows"):
    folder = parent / f"renyi-run-{pid}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o700)
    (folder / "previous-ledger.parquet").write_bytes(secret)
    return folder


def test_remove_stale_run_dirs_removes_the_folders_of_processes_that_are_gone_only(tmp_path):
    stale = _run_dir(tmp_path, _dead_pid())
    live = _run_dir(tmp_path, os.getppid())  # pytest's parent is running
    (tmp_path / "renyi-run-abcdefgh").mkdir()  # no pid in its name: not known to be stale
    (tmp_path / "other-run-1-x").mkdir()
    assert remove_stale_run_dirs("renyi-run-", tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "renyi-run-abcdefgh", "other-run-1-x"])


def test_remove_stale_run_dirs_takes_a_pid_no_process_can_have_for_a_gone_one(tmp_path):
    # Beyond pid_t os.kill raises OverflowError: such a name must not stop every later run.
    stale = _run_dir(tmp_path, 10**20)
    assert remove_stale_run_dirs("renyi-run-", tmp_path) == [stale]


def test_remove_stale_run_dirs_leaves_the_folders_of_other_users(tmp_path, monkeypatch):
    stale = _run_dir(tmp_path, _dead_pid())
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as if someone else had made it
    assert remove_stale_run_dirs("renyi-run-", tmp_path) == []
    assert stale.is_dir()


def test_remove_stale_run_dirs_does_not_follow_a_symbolic_link(tmp_path):
    target = tmp_path / "kept"
    target.mkdir()
    (target / "f").write_bytes(b"x")
    link = tmp_path / f"renyi-run-{_dead_pid()}-link"
    link.symlink_to(target)
    assert remove_stale_run_dirs("renyi-run-", tmp_path) == []
    assert (target / "f").exists() and link.is_symlink()


def test_private_run_dir_is_named_with_the_pid_0700_and_removed_after_the_block(tmp_path, umask_022):
    with private_run_dir("renyi-run-", tmp_path) as folder:
        assert folder.parent == tmp_path and folder.name.startswith(f"renyi-run-{os.getpid()}-")
        assert _mode(folder) == 0o700
        (folder / "previous-ledger.parquet").write_bytes(b"x")
    assert list(tmp_path.iterdir()) == []


def test_private_run_dir_first_removes_the_stale_folders_of_killed_runs(tmp_path):
    stale = _run_dir(tmp_path, _dead_pid())
    with private_run_dir("renyi-run-", tmp_path) as folder:
        assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert not stale.exists()


def test_public_file_mode_is_the_callers_umask_even_inside_a_private_umask_block(umask_022):
    assert public_file_mode() == 0o644
    with private_umask():
        assert public_file_mode() == 0o644
    assert _umask() == 0o022
