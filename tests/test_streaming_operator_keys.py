"""A key to start with (issue 37): ``renyi-stream key create PATH`` makes the noise key a Beam job
reads (0600 in 0700 folders, its fingerprint printed, never over an existing file), and a streaming
replay without its key names that command."""

from __future__ import annotations

import stat
from pathlib import Path

from renyi_stream.pipelines.cli.main import main
from renyi_stream.stream.noise import NoiseKey
from test_streaming_job import DECLARED, _rows


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_key_create_makes_a_0600_key_in_0700_folders_and_prints_its_fingerprint(tmp_path, capsys, umask_022):
    path = tmp_path / "keys" / "curator" / "stream.noise.key"
    assert main(["key", "create", str(path)]) == 0
    out = capsys.readouterr().out
    key = NoiseKey.load(path)
    assert f"created the noise key {path} (mode 0600); fingerprint {key.fingerprint}" in out
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700 and _mode(path.parent.parent) == 0o700


def test_key_create_refuses_to_overwrite_an_existing_file(tmp_path, capsys):
    path = tmp_path / "stream.noise.key"
    assert main(["key", "create", str(path)]) == 0
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["key", "create", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"renyi-stream key create: error: argument PATH: {path} already exists: a noise key is never overwritten" in err
    assert path.read_bytes() == before
    other = tmp_path / "notes.txt"
    other.write_text("not a key")
    assert main(["key", "create", str(other)]) == 1 and other.read_text() == "not a key"


def test_a_streaming_replay_without_its_key_names_the_command_that_creates_it(tmp_path, capsys):
    import pyarrow.parquet as pq

    day = tmp_path / "day=2026-03-01.parquet"
    pq.write_table(_rows(0, [1, 2], seed=1), day)
    key = tmp_path / "stream.noise.key"
    argv = ["stream", "--replay", str(day), *DECLARED, "--start", "2026-03-01", "--end", "2026-03-01",
            "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--releases-parquet", str(tmp_path / "public"),
            "--output", str(tmp_path / "curator"), "--noise-key", str(key), "--shards", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"the noise key {key} does not exist: create it with 'renyi-stream key create {key}'" in err, err
    assert "--key-fingerprint" in err and not (tmp_path / "curator").exists()
    assert main(["key", "create", str(key)]) == 0  # what the message says, and the job runs
    assert main(argv) == 0
