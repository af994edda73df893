"""The batch training stage end to end: features from daily indicator files, then
``renyi-stream train`` on the same ledger the daily job charges, with real Parquet and DuckDB."""

from __future__ import annotations

import datetime as dt
import json
import sys

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.curator_store import CuratorStore
from pipelines.daily_job import JobConfig, run_job
from pipelines.features import load_features, materialise_features
from pipelines.train import TrainConfig, TrainRefused, run_train
from stream.ledger import Ledger
from stream.training.models import load_model

pytestmark = pytest.mark.filterwarnings("ignore::stream.noise.InsecureNoiseWarning")

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


def _day(offset: int) -> str:
    return (DAY0 + dt.timedelta(days=offset)).isoformat()


def _write_days(folder, days=6, users=300, seed=0):
    """Users with a propensity; label indicator `bought` follows the propensity."""
    rng = np.random.default_rng(seed)
    propensity = rng.uniform(0, 1, size=users)
    paths = []
    for d in range(days):
        opened = rng.random(users) < propensity
        bought = rng.random(users) < 0.6 * propensity**2
        rows = np.flatnonzero(opened | bought)
        path = folder / f"day{d}.parquet"
        pq.write_table(pa.table({
            "user_id": pa.array(rows.astype(np.int64)),
            "day": pa.array([DAY0 + dt.timedelta(days=d)] * rows.size, type=pa.date32()),
            "opened": pa.array(opened[rows].astype(np.float64)),
            "bought": pa.array(bought[rows].astype(np.float64)),
        }), path)
        paths.append(str(path))
    return paths


def test_features_are_per_user_means_and_active_shares_with_a_later_label(tmp_path):
    rows = pa.table({
        "user_id": pa.array([1, 1, 2, 1, 2, 1, 1], type=pa.int64()),
        "day": pa.array([DAY0, DAY0 + dt.timedelta(days=1), DAY0, DAY0 + dt.timedelta(days=3),
                         DAY0 + dt.timedelta(days=3), DAY0, DAY0 + dt.timedelta(days=4)], type=pa.date32()),
        "opened": pa.array([1.0, 1.0, 0.0, 0.0, 0.0, 9.0, 0.0]),
        "bought": pa.array([0.0, 2.0, 1.0, 1.0, 0.0, 9.0, 0.0]),
    })
    pq.write_table(rows.slice(0, 5), tmp_path / "a.parquet")
    pq.write_table(rows.slice(5), tmp_path / "b.parquet")  # (1, DAY0) again: the first one is kept
    summary = materialise_features([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "f.parquet",
                                   start=_day(0), end=_day(1), label_column="bought",
                                   label_start=_day(3), label_end=_day(4))
    table = pq.read_table(tmp_path / "f.parquet").to_pydict()
    assert summary.users == 2 and summary.rows_read == 7
    assert table["user_id"] == [1, 2]
    assert table["opened_mean"] == [1.0, 0.0]  # (1 + 1) / 2 days; the repeated 9.0 is ignored
    assert table["opened_active"] == [1.0, 0.0]
    assert table["bought_mean"] == [1.0, 0.5]  # (0 + 2) / 2 and 1 / 2
    assert table["bought_active"] == [0.5, 0.5]
    assert table["active_days"] == [1.0, 0.5]
    assert table["label"] == [1, 0]  # user 1 bought on day 3, user 2 did not
    loaded = load_features(tmp_path / "f.parquet")
    assert loaded.feature_columns == summary.feature_columns and loaded.x.shape == (2, 5)


def test_features_refuse_a_label_window_inside_the_feature_window(tmp_path):
    paths = _write_days(tmp_path, days=2, users=5)
    with pytest.raises(ValueError, match="must not overlap the feature window"):
        materialise_features(paths, tmp_path / "f.parquet", start=_day(0), end=_day(1), label_column="bought",
                             label_start=_day(1), label_end=_day(2))
    with pytest.raises(ValueError, match="label_column must be one of the indicator columns"):
        materialise_features(paths, tmp_path / "f.parquet", start=_day(0), end=_day(0), label_column="nope",
                             label_start=_day(1), label_end=_day(1))


def _features(tmp_path, paths):
    out = tmp_path / "features.parquet"
    materialise_features(paths, out, start=_day(0), end=_day(3), label_column="bought",
                         label_start=_day(4), label_end=_day(5))
    return out


def _used(ledger_path) -> dict:
    db = duckdb.connect(str(ledger_path), read_only=True)
    try:
        return dict(db.execute("SELECT user_id, used FROM ledger").fetchall())
    finally:
        db.close()


def test_streaming_then_training_on_one_ledger_keeps_every_user_within_budget(tmp_path):
    paths = _write_days(tmp_path)
    ledger = tmp_path / "ledger.duckdb"
    job = JobConfig(inputs=tuple(paths[:4]), store=str(tmp_path / "releases.duckdb"), ledger=str(ledger),
                    epsilon=1.0, delta=1e-6, norm_budget=3.0, start_window=W0, end_window=W0 + 3, n_shards=4)
    run_job(job)
    streamed = _used(ledger)
    with CuratorStore(ledger) as store:
        kappa = store.parameters().rho
    assert max(streamed.values()) > 0.3 * kappa  # the daily releases spent a real share
    summary = run_train(TrainConfig(features=str(_features(tmp_path, paths)), ledger=str(ledger), epsilon=1.0,
                                    delta=1e-6, out=str(tmp_path / "model.npz"), steps=10, clip=1.0,
                                    learning_rate=2.0, seed=1))
    after = _used(ledger)
    assert max(after.values()) <= kappa
    assert all(after[u] >= streamed.get(u, 0.0) for u in after)
    spent_out = {u for u, v in streamed.items() if v >= kappa * (1 - 1e-6)}
    assert 0 < len(spent_out) < summary.users  # some users had nothing left for training
    assert all(after[u] == streamed[u] for u in spent_out)  # ... and were charged nothing more
    assert all(after[u] > streamed.get(u, 0.0) for u in after if u not in spent_out)
    # The restored ledger passes the ledger's own checks, and the next daily job continues on it.
    with CuratorStore(ledger) as store:
        Ledger.from_arrow(store.load_ledger(store.parameters()))
    nxt = run_job(JobConfig(**{**job.__dict__, "inputs": tuple(paths[4:5]), "start_window": W0 + 4,
                               "end_window": W0 + 4}))
    assert nxt.balanced and max(_used(ledger).values()) <= kappa
    report = json.loads((tmp_path / "model.json").read_text())
    assert report["privacy"]["ledger_rho"] == kappa and report["privacy"]["run_rho"] <= kappa
    assert [q["step"] for q in report["accuracy_queries"]] == [10, 15, 20, 25, 30, 35, 40, 45]
    model, params, meta = load_model(tmp_path / "model.npz")
    assert model.name == "logreg" and params["W"].shape == (5, 2) and meta["privacy"]["insecure_seed"] is True


def test_the_train_command_on_a_new_ledger_writes_model_report_and_ledger(tmp_path, capsys):
    features = _features(tmp_path, _write_days(tmp_path))
    code = main(["train", "--features", str(features), "--ledger", str(tmp_path / "new.duckdb"),
                 "--epsilon", "0.5", "--delta", "1e-5", "--out", str(tmp_path / "m.npz"), "--model", "mlp",
                 "--hidden", "8", "--steps", "5", "--stop-queries", "2", "--seed", "3"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "[train] step 1/10" in captured.err and "noisy train accuracy" in captured.err
    assert "kept step" in captured.out
    used = _used(tmp_path / "new.duckdb")
    with CuratorStore(tmp_path / "new.duckdb") as store:
        params = store.parameters()
    assert params.epsilon == 0.5 and params.accounting == "gdp" and max(used.values()) <= params.rho
    assert json.loads((tmp_path / "m.json").read_text())["model"] == {"model": "mlp", "hidden": 8}


def test_training_with_another_promise_than_the_ledgers_is_refused_and_charges_nobody(tmp_path, capsys):
    features = _features(tmp_path, _write_days(tmp_path))
    args = ["train", "--features", str(features), "--ledger", str(tmp_path / "l.duckdb"), "--delta", "1e-5",
            "--out", str(tmp_path / "m.npz"), "--steps", "3", "--no-stopping", "--seed", "1"]
    assert main(args + ["--epsilon", "1.0"]) == 0
    before = _used(tmp_path / "l.duckdb")
    capsys.readouterr()
    assert main(args + ["--epsilon", "2.0"]) == 1
    err = capsys.readouterr().err
    assert "epsilon: ledger has 1.0, this training asks 2.0" in err
    assert _used(tmp_path / "l.duckdb") == before
    assert main(args + ["--epsilon", "1.0", "--accounting", "zcdp-thm49"]) == 1
    assert "accounting: ledger has 'gdp'" in capsys.readouterr().err


def test_train_parameters_out_of_range_exit_2_naming_the_parameter(tmp_path, capsys):
    features = _features(tmp_path, _write_days(tmp_path, days=6, users=20))
    base = ["train", "--features", str(features), "--ledger", str(tmp_path / "l.duckdb"), "--epsilon", "1",
            "--delta", "1e-5", "--out", str(tmp_path / "m.npz")]
    assert main(base + ["--clip", "-1"]) == 2
    assert "clip must be > 0, got clip=-1.0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="stopping \\(Appendix A\\) extends Algorithm 7"):
        TrainConfig(features="f", ledger="l", epsilon=1.0, delta=0.1, out="m", filtering=False, stopping=True)
    assert main(base + ["--train-rho", "5"]) == 2
    assert "train_rho must be <= the ledger budget" in capsys.readouterr().err
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\), got delta=2"):
        TrainConfig(features="f", ledger="l", epsilon=1.0, delta=2, out="m")
    assert not (tmp_path / "m.npz").exists()


def test_algorithm_6_stage_runs_exactly_k_steps(tmp_path):
    features = _features(tmp_path, _write_days(tmp_path, users=50))
    summary = run_train(TrainConfig(features=str(features), ledger=str(tmp_path / "l.duckdb"), epsilon=1.0,
                                    delta=1e-6, out=str(tmp_path / "m.npz"), steps=7, filtering=False,
                                    stopping=False, seed=2))
    assert summary.steps_run == 7 and summary.accuracy_queries == []
    with pytest.raises(TrainRefused, match="another promise"):
        run_train(TrainConfig(features=str(features), ledger=str(tmp_path / "l.duckdb"), epsilon=1.0,
                              delta=1e-7, out=str(tmp_path / "m2.npz"), seed=2))


def test_training_on_the_gpu_without_cupy_exits_1_naming_the_extra_and_touches_no_ledger(tmp_path, capsys,
                                                                                         monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # as on a machine without the gpu extra
    features = _features(tmp_path, _write_days(tmp_path, users=20))
    code = main(["train", "--features", str(features), "--ledger", str(tmp_path / "l.duckdb"), "--epsilon", "1",
                 "--delta", "1e-5", "--out", str(tmp_path / "m.npz"), "--device", "gpu"])
    assert code == 1
    assert "device='gpu' needs CuPy: pip install 'renyi-stream[gpu]'" in capsys.readouterr().err
    assert not (tmp_path / "l.duckdb").exists() and not (tmp_path / "m.npz").exists()
