"""The features stage as a Beam batch job (issue 21, item 3): it writes the file the DuckDB stage
wrote (golden files under tests/data/features_golden, made by that stage before it was replaced),
on the daily job's read and validation, with real DirectRunner pipelines and real Parquet.

Reference for random inputs: a plain Python computation in this file (rows in input order, the
first row of each (user, day) kept, sums per user), not the job's code."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import re
import shutil
import stat
from collections import defaultdict
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.curator.features import FEATURES_KEY, ROWS_KEY, load_features
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.pipelines.features.job import materialise_features
from renyi_stream.stream.contract import DeclaredColumn, InputContract
from renyi_stream.stream.engine.readers import InputFileError

GOLDEN = Path(__file__).parent / "data" / "features_golden"
WINDOWS = {"start": "2026-03-01", "end": "2026-03-04", "label_column": "bought",
           "label_start": "2026-03-06", "label_end": "2026-03-07"}
INPUTS = {"int_ids": ("int_a.parquet", "int_b.csv", "int_c.parquet"), "string_ids": ("str_a.parquet", "str_b.csv")}
DAY0 = dt.date(2026, 3, 1)


def _inputs(name: str) -> list[str]:
    return [str(GOLDEN / "inputs" / f) for f in INPUTS[name]]


def _feature_args(inputs, out, *extra):
    return ["features", "--input", *map(str, inputs), "--out", str(out), "--start", WINDOWS["start"], "--end",
            WINDOWS["end"], "--label-column", "bought", "--label-start", WINDOWS["label_start"], "--label-end",
            WINDOWS["label_end"], *extra]


@pytest.fixture(scope="module")
def int_run(tmp_path_factory):
    """One run of the job over the int-id fixture: (summary, features path, dead-letter path)."""
    root = tmp_path_factory.mktemp("int_run")
    summary = materialise_features(_inputs("int_ids"), root / "f.parquet", dead_letters=root / "dead.parquet",
                                   n_shards=4, **WINDOWS)
    return summary, root / "f.parquet", root / "dead.parquet"


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_the_beam_job_writes_the_duckdb_stages_golden_file(tmp_path, name, int_run):
    if name == "int_ids":
        summary, out, _ = int_run
    else:
        out = tmp_path / "f.parquet"
        summary = materialise_features(_inputs(name), out, **WINDOWS)
    golden, written = pq.read_table(GOLDEN / f"{name}.parquet"), pq.read_table(out)
    assert written.schema.names == golden.schema.names
    assert [(f.type, f.nullable) for f in written.schema] == [(f.type, f.nullable) for f in golden.schema]
    assert written.replace_schema_metadata(None).equals(golden.replace_schema_metadata(None))  # values, exactly
    # The schema metadata: what the features are, as before, plus the classes the labels are declared
    # in (two: 0 or 1; issue 28, a model's shape is never read off the labels); beside it only this
    # run's own record.
    assert json.loads(written.schema.metadata[FEATURES_KEY]) == \
        {**json.loads(golden.schema.metadata[FEATURES_KEY]), "classes": 2}
    assert set(written.schema.metadata) - set(golden.schema.metadata) == {ROWS_KEY}
    expected = json.loads((GOLDEN / "summary.json").read_text())[name]
    assert (summary.users, summary.positives, summary.rows_read) == \
        (expected["users"], expected["positives"], expected["rows_read"])


def test_every_row_read_is_kept_or_a_dead_letter_and_repeats_across_files_are_counted(int_run):
    # The DuckDB stage dropped a repeat of a (user, day) from a later file without counting it
    # (summary.json: 7 rejected); each is now a duplicate_user_window dead letter, as in the daily job.
    summary, _, dead = int_run
    letters = pq.read_table(dead)
    assert summary.rows_rejected == letters.num_rows == sum(summary.rejected_by_reason.values())
    assert summary.rejected_by_reason == {"duplicate_user_window": 138, "malformed_row": 1, "non_finite_value": 1,
                                          "null_user_id": 1, "out_of_range_time": 2, "wrong_type": 1}
    read, kept = _fixture_rows_read_and_kept()
    assert summary.rows_read == read == kept + summary.rows_rejected


def test_the_dead_letters_are_the_daily_jobs_for_the_same_input(tmp_path, int_run):
    # The daily job over the features job's schedule (first day read to last day read): the
    # same rows dead-lettered, for the same reasons, named by the same file and row.
    _, _, dead = int_run
    ledger = tmp_path / "ledger.duckdb"
    run_job(JobConfig(inputs=tuple(_inputs("int_ids")), store=str(tmp_path / "releases.duckdb"), ledger=str(ledger),
                      epsilon=1.0, delta=1e-6, norm_budget=1e4, start_window=(DAY0 - dt.date(1970, 1, 1)).days,
                      end_window=(DAY0 - dt.date(1970, 1, 1)).days + 6, n_shards=3,
                      # the ledger's contract: the columns the features job reads as numbers, each
                      # bounded by the range of the fixture's values
                      contract=InputContract("int64", (DeclaredColumn("opened", "number", 0.0, 9.0),
                                                       DeclaredColumn("bought", "number", 0.0, 9.0),
                                                       DeclaredColumn("minutes", "number", 0.0, 99.0)))))
    db = duckdb.connect(str(ledger), read_only=True)
    try:
        daily = db.execute("SELECT source, row_index, reason FROM dead_letters ORDER BY ALL").fetchall()
    finally:
        db.close()
    ours = pq.read_table(dead).select(["source", "row_index", "reason"]).sort_by(
        [("source", "ascending"), ("row_index", "ascending"), ("reason", "ascending")])
    assert sorted(tuple(r.values()) for r in ours.to_pylist()) == daily


def test_the_features_and_dead_letter_files_are_0600_under_umask_022(tmp_path, umask_022, not_private):
    out = tmp_path / "curator" / "features.parquet"
    materialise_features(_inputs("string_ids"), out, dead_letters=tmp_path / "curator" / "dead.parquet", **WINDOWS)
    assert sorted(p.name for p in out.parent.iterdir()) == ["dead.parquet", "features.parquet"]  # no scratch left
    assert not_private(out.parent) == {}


def _reference_rows(paths):
    """The valid rows of Parquet inputs with a ``day`` column, in input order, the first of each
    (user, day) only, checked in Python (a reference, independent of the job's validator)."""
    seen, rows = set(), []
    lo, hi = dt.date.fromisoformat(WINDOWS["start"]), dt.date.fromisoformat(WINDOWS["label_end"])
    for path in paths:
        for r in pq.read_table(path).to_pylist():
            values = [r["opened"], r["bought"], r["minutes"]]
            if r["user_id"] is None or not np.all(np.isfinite(values)) or not lo <= r["day"] <= hi:
                continue
            if (r["user_id"], r["day"]) not in seen:
                seen.add((r["user_id"], r["day"]))
                rows.append({"user_id": r["user_id"], "day": r["day"], "values": values})
    return rows


def _fixture_rows_read_and_kept() -> tuple[int, int]:
    """The int fixture's rows (every Parquet row and CSV line) and its distinct valid (user, day)
    pairs, counted in Python from the files (a CSV line valid when it has five fields and numbers)."""
    read, keys = 0, set()
    for f in INPUTS["int_ids"]:
        path = GOLDEN / "inputs" / f
        if f.endswith(".csv"):
            lines = path.read_text().splitlines()[1:]
            read += len(lines)
            for parts in (line.split(",") for line in lines):
                if len(parts) == 5 and parts[2] != "x":
                    keys.add((int(parts[0]), dt.date.fromisoformat(parts[1])))
            continue
        table = pq.read_table(path)
        read += table.num_rows
        time = table.column("day" if "day" in table.column_names else "event_time").to_pylist()
        for user, t, opened in zip(table.column("user_id").to_pylist(), time, table.column("opened").to_pylist()):
            day = t.date() if isinstance(t, dt.datetime) else t
            if user is not None and np.isfinite(opened) and DAY0 <= day <= DAY0 + dt.timedelta(days=6):
                keys.add((user, day))
    return read, len(keys)


def _random_inputs(folder: Path, seed: int, files: int = 4, users: int = 400, rows: int = 1500):
    """Random daily rows over days -2..9 (some outside the windows), float values with NaNs and
    repeats within and across files, spread over Parquet files in no particular order."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(files):
        n = rows // files
        user = rng.integers(0, users, size=n)
        day = rng.integers(-2, 10, size=n)
        opened = np.round(rng.exponential(1.0, size=n) * (rng.random(n) < 0.6), 3)
        bought = (rng.random(n) < 0.2).astype(np.float64) * rng.choice([1.0, -1.0, 2.5], size=n)
        minutes = rng.integers(0, 3, size=n)
        opened[rng.random(n) < 0.01] = np.nan
        path = folder / f"part{i}.parquet"
        pq.write_table(pa.table({"user_id": pa.array(user, type=pa.int64()),
                                 "day": pa.array([DAY0 + dt.timedelta(days=int(d)) for d in day], type=pa.date32()),
                                 "opened": opened, "bought": bought, "minutes": pa.array(minutes, type=pa.int64())}),
                       path)
        paths.append(str(path))
    return paths


def _reference_features(paths):
    """``{user: (features, label)}`` by the stage's definition, over :func:`_reference_rows`."""
    start, end = (dt.date.fromisoformat(WINDOWS[k]) for k in ("start", "end"))
    label_start, label_end = (dt.date.fromisoformat(WINDOWS[k]) for k in ("label_start", "label_end"))
    days = (end - start).days + 1
    sums, active, present, label = (defaultdict(lambda: np.zeros(3)), defaultdict(lambda: np.zeros(3)),
                                    defaultdict(int), defaultdict(float))
    for r in _reference_rows(paths):
        v = np.array(r["values"], dtype=np.float64)
        if start <= r["day"] <= end:
            sums[r["user_id"]] += v
            active[r["user_id"]] += v != 0
            present[r["user_id"]] += 1
        elif label_start <= r["day"] <= label_end:
            label[r["user_id"]] += r["values"][1]
    out = {}
    for user in sorted(present):
        feats = np.column_stack([sums[user] / days, active[user] / days]).ravel()
        out[user] = (np.r_[feats, present[user] / days], int(label[user] > 0))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_the_job_equals_a_direct_computation_on_random_input(tmp_path, seed):
    paths = _random_inputs(tmp_path, seed)
    expected = _reference_features(paths)
    summary = materialise_features(paths, tmp_path / "f.parquet", n_shards=5, **WINDOWS)
    written = pq.read_table(tmp_path / "f.parquet")
    assert written.column("user_id").to_pylist() == list(expected)  # one row per user, sorted
    x = np.column_stack([written.column(c).to_numpy() for c in summary.feature_columns])
    np.testing.assert_allclose(x, np.array([f for f, _ in expected.values()]), rtol=1e-12, atol=0)
    assert written.column("label").to_pylist() == [label for _, label in expected.values()]


def test_the_output_does_not_depend_on_the_number_of_shards(tmp_path):
    paths = _random_inputs(tmp_path, seed=3)
    materialise_features(paths, tmp_path / "one.parquet", n_shards=1, **WINDOWS)
    materialise_features(paths, tmp_path / "many.parquet", n_shards=13, **WINDOWS)
    one, many = pq.read_table(tmp_path / "one.parquet"), pq.read_table(tmp_path / "many.parquet")
    assert one.replace_schema_metadata(None).equals(many.replace_schema_metadata(None))  # bit for bit


def _day_table(user_ids, opened, day=DAY0):
    return pa.table({"user_id": pa.array(user_ids, type=pa.int64()), "day": pa.array([day] * len(user_ids),
                     type=pa.date32()), "opened": pa.array(opened), "bought": pa.array([0.0] * len(user_ids))})


def test_a_repeated_user_day_keeps_the_row_of_the_input_listed_first(tmp_path):
    pq.write_table(_day_table([1, 2], [1.0, 0.0]), tmp_path / "a.parquet")
    pq.write_table(_day_table([1], [0.0]), tmp_path / "b.parquet")
    for order, expected in (((tmp_path / "a.parquet", tmp_path / "b.parquet"), 0.25),
                            ((tmp_path / "b.parquet", tmp_path / "a.parquet"), 0.0)):
        materialise_features(list(order), tmp_path / "f.parquet", **WINDOWS)
        table = pq.read_table(tmp_path / "f.parquet").to_pydict()
        assert table["opened_mean"][table["user_id"].index(1)] == expected


def test_a_csv_as_first_input_gives_its_columns_as_the_daily_job_does(tmp_path):
    # A CSV declares no types: as in the daily job, every non-key column is an indicator (the
    # DuckDB stage took none from a CSV and refused --label-column).
    csv = tmp_path / "day.csv"
    csv.write_text("user_id,day,opened,bought\n1,2026-03-01,1,0\n2,2026-03-02,0,1\n1,2026-03-06,0,1\n")
    summary = materialise_features([csv], tmp_path / "f.parquet", **WINDOWS)
    assert summary.feature_columns[:4] == ("opened_mean", "opened_active", "bought_mean", "bought_active")
    assert pq.read_table(tmp_path / "f.parquet").column("label").to_pylist() == [1, 0]


def test_a_text_id_in_a_later_file_of_an_int_ledger_is_a_wrong_type_dead_letter(tmp_path):
    # The first input's id type is the run's, as in the daily job: a later CSV with a text id
    # costs that row (the DuckDB stage failed on the mixed types).
    pq.write_table(_day_table([1, 2], [1.0, 0.0]), tmp_path / "a.parquet")
    (tmp_path / "b.csv").write_text("user_id,day,opened,bought\nabc,2026-03-02,1,0\n3,2026-03-02,1,0\n")
    summary = materialise_features([tmp_path / "a.parquet", tmp_path / "b.csv"], tmp_path / "f.parquet", **WINDOWS)
    assert summary.rejected_by_reason == {"wrong_type": 1}
    assert pq.read_table(tmp_path / "f.parquet").column("user_id").to_pylist() == [1, 2, 3]


@pytest.mark.parametrize("broken", ["no_user_id", "cut_parquet"])
def test_a_broken_file_is_refused_naming_it_and_the_previous_output_is_kept(tmp_path, broken):
    good = tmp_path / "good.parquet"
    pq.write_table(_day_table([1, 2], [1.0, 0.0]), good)
    bad = tmp_path / "bad.parquet"
    if broken == "no_user_id":
        pq.write_table(_day_table([1], [1.0]).drop_columns(["user_id"]), bad)
    else:
        bad.write_bytes(good.read_bytes()[:-20])
    out = tmp_path / "f.parquet"
    out.write_bytes(b"the previous features")
    with pytest.raises(InputFileError, match=f"^input file {bad}"):
        materialise_features([good, bad], out, **WINDOWS)
    assert out.read_bytes() == b"the previous features"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet", "f.parquet", "good.parquet"]


def test_inputs_without_a_valid_row_give_a_features_file_of_no_user(tmp_path):
    # Not a refusal: whether the job succeeds (and a model is trained on it) must not hinge on
    # whether one user's row is there (issue 37, item 1).
    pq.write_table(_day_table([1, 2], [np.nan, 1.0], day=DAY0 - dt.timedelta(days=5)), tmp_path / "a.parquet")
    summary = materialise_features([tmp_path / "a.parquet"], tmp_path / "f.parquet", **WINDOWS)
    assert (summary.users, summary.rows_read, summary.rows_rejected) == (0, 2, 2)
    assert load_features(tmp_path / "f.parquet").x.shape == (0, len(summary.feature_columns))


def test_an_empty_input_file_gives_a_features_file_of_no_user(tmp_path):
    pq.write_table(_day_table([1], [1.0]).slice(0, 0), tmp_path / "a.parquet")
    summary = materialise_features([tmp_path / "a.parquet"], tmp_path / "f.parquet", **WINDOWS)
    assert (summary.users, summary.rows_read) == (0, 0)


def _features_then_train(root: Path, user_ids: list[int]) -> tuple[list[int], list[str]]:
    """The features job then train, through the CLI as an operator runs them quietly: their exit
    codes and console lines (what an operator's automation sees), with the curator's counts in
    the files, not here."""
    root.mkdir()
    day = pa.table({"user_id": pa.array(user_ids, type=pa.int64()),
                    "day": pa.array([DAY0] * len(user_ids), type=pa.date32()),
                    "opened": pa.array([1.0] * len(user_ids), type=pa.float64()),
                    "bought": pa.array([1.0] * len(user_ids), type=pa.float64())})
    pq.write_table(day, root / "day.parquet")
    codes, lines = [], []
    for argv in (_feature_args([root / "day.parquet"], root / "f.parquet", "--quiet"),
                 ["train", "--features", str(root / "f.parquet"), "--ledger", str(root / "ledger.duckdb"),
                  "--new-ledger", "--epsilon", "1", "--delta", "1e-6", "--out", str(root / "m.npz"), "--steps", "3",
                  "--train-rho", "0.01", "--quiet"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            codes.append(main(argv))
        # Numbers masked: train's line carries released values (the noisy count, the step the
        # noisy accuracy chose), which are meant to differ; its words and shape are not.
        lines.append(re.sub(r"[0-9]+(\.[0-9]+)?", "<n>", (out.getvalue() + err.getvalue()).replace(str(root), "<root>")))
    return codes, lines


def test_one_users_row_changes_neither_exit_codes_nor_quiet_console_of_features_and_train(tmp_path):
    # The inputs differ by the one user whose row is the only valid one: with it the model is
    # trained on one user, without it on nobody (noise alone); both runs succeed alike.
    without = _features_then_train(tmp_path / "without", [])
    with_one = _features_then_train(tmp_path / "with", [7])
    assert without == with_one
    assert without[0] == [0, 0]
    assert (tmp_path / "without" / "m.npz").exists() and (tmp_path / "with" / "m.npz").exists()


def test_renyi_stream_features_passes_beam_options_through_and_writes_a_loadable_0600_file(tmp_path, capsys):
    out = tmp_path / "f.parquet"
    code = main(_feature_args(_inputs("string_ids"), out, "--runner", "DirectRunner", "--direct_num_workers=1",
                              "--shards", "3", "--quiet"))
    assert code == 0, capsys.readouterr().err
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    features = load_features(out)  # what renyi-stream train reads (tests/test_train_stage.py trains on it)
    golden = pq.read_table(GOLDEN / "string_ids.parquet")
    assert features.user_ids.to_pylist() == golden.column("user_id").to_pylist()
    assert features.feature_columns == tuple(json.loads(golden.schema.metadata[FEATURES_KEY])["feature_columns"])


def test_renyi_stream_features_refuses_an_option_neither_it_nor_beam_knows(tmp_path, capsys):
    code = main(_feature_args(_inputs("string_ids"), tmp_path / "f.parquet", "--runer=DataflowRunner"))
    err = capsys.readouterr().err
    assert code == 2
    assert "argument --runer: not an option of features nor of Beam" in err and "did you mean --runner?" in err
    assert not (tmp_path / "f.parquet").exists()


def test_the_features_file_trains(tmp_path, int_run):
    _, out, _ = int_run
    local = tmp_path / "f.parquet"
    shutil.copy(out, local)
    os.chmod(local, 0o600)
    code = main(["train", "--features", str(local), "--ledger", str(tmp_path / "ledger.duckdb"), "--new-ledger",
                 "--epsilon", "1", "--delta", "1e-6", "--out", str(tmp_path / "m.npz"), "--steps", "3",
                 "--no-stopping", "--train-rho", "0.01", "--quiet"])
    assert code == 0
