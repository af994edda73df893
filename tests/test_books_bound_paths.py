"""No silent creation outside a job's first run (issue 37, item 2): ``train``, ``features``,
``privacy-report`` and ``query`` refuse a ledger or release store that does not exist, naming the
option and the path, and create nothing (no file, no folder, no lock, no key). A new ledger or
store is made only when asked for: ``train --new-ledger``, ``query add --create``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.curator.features import FEATURES_KEY


def _features_file(folder: Path) -> Path:
    """A features file as the features job writes one: 40 users, two features, a 0/1 label."""
    rng = np.random.default_rng(0)
    path = folder / "features.parquet"
    table = pa.table({"user_id": pa.array(np.arange(40, dtype=np.int64)),
                      "f0": pa.array(rng.uniform(size=40)), "f1": pa.array(rng.uniform(size=40)),
                      "label": pa.array(rng.integers(0, 2, size=40), type=pa.int64())})
    meta = {"feature_columns": ["f0", "f1"], "label": "label", "classes": 2}
    pq.write_table(table.replace_schema_metadata({FEATURES_KEY: json.dumps(meta)}), path)
    path.chmod(0o600)
    return path


def _status(argv: list[str], capsys) -> tuple[object, str]:
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


def _train(features: Path, ledger: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--features", str(features), "--ledger", str(ledger), "--epsilon", "1", "--delta", "1e-6",
            "--train-rho", "0.01", "--steps", "2", "--no-stopping", "--out", str(out), "--quiet", *extra]


# (command, argv with {m}: the missing path in a folder that does not exist, {t}: this test's folder;
#  the option the message names; the exit status)
MISSING = [
    ("train", _train(Path("{t}/features.parquet"), Path("{m}"), Path("{t}/m.npz")), "--ledger", 1),
    ("query add", ["query", "add", "--store", "{m}", "--id", "q", "--columns", "a", "--from", "2026-03-01"],
     "--store", 1),
    ("query add", ["query", "add", "--releases-parquet", "{m}", "--id", "q", "--columns", "a", "--from",
                   "2026-03-01"], "--releases-parquet", 1),
    ("query retire", ["query", "retire", "--store", "{m}", "--id", "q", "--from", "2026-03-01"], "--store", 1),
    ("query retire", ["query", "retire", "--releases-parquet", "{m}", "--id", "q", "--from", "2026-03-01"],
     "--releases-parquet", 1),
    ("query list", ["query", "list", "--store", "{m}"], "--store", 1),
    ("query contract", ["query", "contract", "--store", "{m}"], "--store", 1),
    ("features", ["features", "--input", "{t}/features.parquet", "--out", "{t}/f.parquet", "--start", "2026-03-01",
                  "--end", "2026-03-02", "--label-column", "f0", "--label-start", "2026-03-03", "--label-end",
                  "2026-03-04", "--ledger", "{m}"], "--ledger", 2),
    ("privacy-report", ["privacy-report", "--ledger", "{m}", "--user", "1"], "--ledger", 1),
]


@pytest.mark.parametrize("command, argv, option, status", MISSING,
                         ids=[f"{c.replace(' ', '-')}-{o.lstrip('-')}" for c, _, o, _ in MISSING])
def test_a_ledger_or_store_that_does_not_exist_is_refused_naming_the_option_and_nothing_is_created(
        tmp_path, capsys, command, argv, option, status):
    _features_file(tmp_path)
    missing = tmp_path / "typo" / "ledger-or-store.duckdb"
    before = sorted(tmp_path.rglob("*"))
    code, err = _status([a.format(t=tmp_path, m=missing) for a in argv], capsys)
    assert code == status, err
    assert option in err and str(missing) in err and "does not exist" in err and "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before  # not the file, its folder, a lock, a key or a model


def test_train_on_a_missing_ledger_names_new_ledger_and_with_it_starts_the_ledger(tmp_path, capsys):
    features, ledger = _features_file(tmp_path), tmp_path / "curator" / "ledger.duckdb"
    code, err = _status(_train(features, ledger, tmp_path / "m.npz"), capsys)
    assert code == 1 and "argument --ledger:" in err and "--new-ledger" in err and not ledger.parent.exists()
    assert main(_train(features, ledger, tmp_path / "m.npz", "--new-ledger")) == 0
    assert ledger.is_file() and (tmp_path / "curator" / "ledger.noise.key").is_file()
    assert main(_train(features, ledger, tmp_path / "m2.npz")) == 0  # an existing ledger needs no flag


@pytest.mark.parametrize("where, target", [("--store", "s.duckdb"), ("--releases-parquet", "public")])
def test_query_add_on_a_missing_store_names_create_and_with_it_makes_the_store(tmp_path, capsys, where, target):
    path = tmp_path / target
    argv = ["query", "add", where, str(path), "--id", "q", "--columns", "a", "--from", "2026-03-01"]
    code, err = _status(argv, capsys)
    assert code == 1 and "--create" in err and not path.exists()
    assert main(argv + ["--create"]) == 0 and path.exists()
    assert main(["query", "add", where, str(path), "--id", "r", "--columns", "a", "--from", "2026-03-01"]) == 0
