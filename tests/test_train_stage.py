"""The batch training stage end to end: features from daily indicator files, then
``renyi-stream train`` on the same ledger the daily job charges, with real Parquet and DuckDB."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.curator.store import CuratorStore
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.pipelines.curator.features import FEATURES_KEY, load_features
from renyi_stream.pipelines.features.job import materialise_features
import renyi_stream.pipelines.curator.train as train_module
import renyi_stream.stream.training.models as models_module
from renyi_stream.pipelines.curator.train import TrainConfig, TrainRefused, run_train
from renyi_stream.stream.faults import CRASH_ENV
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.training.models import load_model

from declared import contract

pytestmark = pytest.mark.filterwarnings("ignore::renyi_stream.stream.noise.InsecureNoiseWarning")

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
                    epsilon=1.0, delta=1e-6, norm_budget=3.0, start_window=W0, end_window=W0 + 3, n_shards=4,
                    contract=contract("int64", "opened=0:1", "bought=0:1"))
    run_job(job)
    streamed = _used(ledger)
    with CuratorStore(ledger) as store:
        kappa = store.parameters().rho
    assert max(streamed.values()) > 0.3 * kappa  # the daily releases spent a real share
    summary = run_train(TrainConfig(features=str(_features(tmp_path, paths)), ledger=str(ledger), epsilon=1.0,
                                    delta=1e-6, out=str(tmp_path / "model.npz"), steps=10, clip=1.0,
                                    learning_rate=2.0, seed=1, train_rho=kappa))  # the whole budget, declared
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
    code = main(["train", "--features", str(features), "--ledger", str(tmp_path / "new.duckdb"), "--new-ledger",
                 "--epsilon", "0.5", "--delta", "1e-5", "--out", str(tmp_path / "m.npz"), "--model", "mlp",
                 "--hidden", "8", "--steps", "5", "--stop-queries", "2", "--seed", "3", "--train-rho", "0.01"])
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
    args = ["train", "--features", str(features), "--ledger", str(tmp_path / "l.duckdb"), "--new-ledger",
            "--delta", "1e-5", "--out", str(tmp_path / "m.npz"), "--steps", "3", "--no-stopping", "--seed", "1",
            "--train-rho", "0.01"]
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
    base = ["train", "--features", str(features), "--ledger", str(tmp_path / "l.duckdb"), "--new-ledger",
            "--epsilon", "1", "--delta", "1e-5", "--out", str(tmp_path / "m.npz"), "--train-rho", "0.01"]
    assert main(base + ["--clip", "-1"]) == 2
    assert "clip must be > 0, got clip=-1.0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="stopping \\(Appendix A\\) extends Algorithm 7"):
        TrainConfig(features="f", ledger="l", epsilon=1.0, delta=0.1, out="m", filtering=False, stopping=True,
                    train_rho=0.01)
    assert main(base + ["--train-rho", "5"]) == 2
    assert "train_rho must be <= the ledger budget" in capsys.readouterr().err
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\), got delta=2"):
        TrainConfig(features="f", ledger="l", epsilon=1.0, delta=2, out="m")
    assert not (tmp_path / "m.npz").exists()


def test_algorithm_6_stage_runs_exactly_k_steps(tmp_path):
    features = _features(tmp_path, _write_days(tmp_path, users=50))
    summary = run_train(TrainConfig(features=str(features), ledger=str(tmp_path / "l.duckdb"), epsilon=1.0,
                                    delta=1e-6, out=str(tmp_path / "m.npz"), steps=7, filtering=False,
                                    stopping=False, seed=2, train_rho=0.028, new_ledger=True))
    assert summary.steps_run == 7 and summary.accuracy_queries == []
    with pytest.raises(TrainRefused, match="another promise"):
        run_train(TrainConfig(features=str(features), ledger=str(tmp_path / "l.duckdb"), epsilon=1.0,
                              delta=1e-7, out=str(tmp_path / "m2.npz"), seed=2, train_rho=0.02))


def test_training_on_the_gpu_without_cupy_exits_1_naming_the_extra_and_touches_no_ledger(tmp_path, capsys,
                                                                                         monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # as on a machine without the gpu extra
    features = _features(tmp_path, _write_days(tmp_path, users=20))
    code = main(["train", "--features", str(features), "--ledger", str(tmp_path / "l.duckdb"), "--new-ledger",
                 "--epsilon", "1", "--delta", "1e-5", "--out", str(tmp_path / "m.npz"), "--device", "gpu",
                 "--train-rho", "0.01"])
    assert code == 1
    assert "device='gpu' needs CuPy: pip install 'renyi-stream[gpu]'" in capsys.readouterr().err
    assert not (tmp_path / "l.duckdb").exists() and not (tmp_path / "m.npz").exists()


# -- released once, no exact counts (issue 18, items 4 and 6) -------------------------------------

REPO = Path(__file__).resolve().parents[1]
_TIMING = re.compile(r"\s+\d+\.\d s$")


def _train_args(features, ledger, out, *extra: str) -> list[str]:
    """``renyi-stream train`` on ``ledger`` (a new one is made when missing), charging each user at
    most 0.028 zCDP (about the whole budget 0.02801 of epsilon 1, delta 1e-6), unless ``extra``
    declares another ``--train-rho``."""
    return ["train", "--features", str(features), "--ledger", str(ledger), "--new-ledger", "--epsilon", "1",
            "--delta", "1e-6", "--out", str(out), "--steps", "4", "--stop-queries", "3", "--stop-every", "2",
            "--train-rho", "0.028", *extra]


def _train_in_a_child(args: list[str], crash_at: str | None = None) -> subprocess.CompletedProcess:
    """``renyi-stream <args>`` in a process of its own, SIGKILLed at ``crash_at`` when given."""
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    return subprocess.run([sys.executable, "-m", "renyi_stream.pipelines.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=300, umask=0o022)


def _progress(stderr: str) -> list[str]:
    """The progress lines without their timings (the only thing a re-run may change)."""
    return [_TIMING.sub("", line) for line in stderr.splitlines() if line.startswith("[train]")]


def _model_scratch(folder: Path, name: str = "m.npz") -> list[Path]:
    """The scratch files of the model ``name`` in ``folder`` (``.<name>.<pid>-<random>.tmp``)."""
    return sorted(folder.glob(f".{name}.*.tmp"))


def _crashed_before_commit(tmp_path):
    """A training run on a new ledger, killed inside the ledger's transaction before COMMIT (under
    umask 022): it leaves the unreleased model in a scratch file only the curator can read."""
    features = _features(tmp_path, _write_days(tmp_path, users=80))
    args = _train_args(features, tmp_path / "ledger.duckdb", tmp_path / "m.npz")
    crashed = _train_in_a_child(args, crash_at="after_ledger_write")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    (scratch,) = _model_scratch(tmp_path)
    assert not (tmp_path / "m.npz").exists() and stat.S_IMODE(scratch.stat().st_mode) == 0o600
    return args, crashed, scratch


def test_a_rerun_after_a_crash_before_the_ledger_commit_releases_the_same_model_and_values(tmp_path):
    args, crashed, scratch = _crashed_before_commit(tmp_path)
    db = duckdb.connect(str(tmp_path / "ledger.duckdb"), read_only=True)
    try:  # the crash charged nobody: the first commit never happened, no ledger table or run yet
        assert db.execute("SELECT count(*) FROM run_counts").fetchone() == (0,)
        assert "ledger" not in {t for (t,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        db.close()
    _, unreleased, unreleased_meta = load_model(scratch)  # what the killed run had computed
    rerun = _train_in_a_child(args)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert _model_scratch(tmp_path) == []  # the killed run's scratch file is gone with it
    _, params, meta = load_model(tmp_path / "m.npz")
    for name in params:
        np.testing.assert_array_equal(params[name], unreleased[name])  # the same noise, bit for bit
    assert meta["privacy"] == unreleased_meta["privacy"]  # the same released noisy count
    before_commit = _progress(crashed.stderr)
    assert _progress(rerun.stderr)[:len(before_commit)] == before_commit  # the same lines printed
    report = json.loads((tmp_path / "m.json").read_text())
    assert report["ledger"]["run_id"] == 1 and report["privacy"]["insecure_seed"] is False


# -- the model's scratch file (issue 28, item 4) ---------------------------------------------------


def test_the_model_scratch_file_is_0600_while_it_exists_under_umask_022(tmp_path, umask_022, monkeypatch):
    """It holds a noisy model of a run not yet charged: nobody else may read it."""
    features = _features(tmp_path, _write_days(tmp_path, users=60))
    (tmp_path / "out").mkdir()
    commit = train_module._commit_ledger
    modes = {}

    def watched_commit(*args, **kwargs):
        modes.update({p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir()})
        return commit(*args, **kwargs)

    monkeypatch.setattr(train_module, "_commit_ledger", watched_commit)
    assert main(_train_args(features, tmp_path / "ledger.duckdb", tmp_path / "out" / "m.npz")) == 0
    assert list(modes.values()) == [0o600], modes  # the model, written, not yet released


def _fail_while_writing_the_model(monkeypatch):
    """``save_model`` that writes half a model, then fails as a full disk would."""

    def half_then_full(path, *args, **kwargs):
        Path(path).write_bytes(b"PK\x03\x04 half a model")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(models_module, "save_model", half_then_full)
    return OSError


def _interrupt_the_ledger_commit(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_commit_ledger", interrupted)
    return KeyboardInterrupt


@pytest.mark.parametrize("fail", [_fail_while_writing_the_model, _interrupt_the_ledger_commit],
                         ids=["disk-full-in-save", "interrupt-in-commit"])
def test_a_run_that_fails_once_the_model_scratch_exists_leaves_no_scratch_and_no_model(tmp_path, umask_022,
                                                                                      monkeypatch, fail):
    features = _features(tmp_path, _write_days(tmp_path, users=60))
    (tmp_path / "out").mkdir()
    config = TrainConfig(features=str(features), ledger=str(tmp_path / "ledger.duckdb"), epsilon=1.0, delta=1e-6,
                         out=str(tmp_path / "out" / "m.npz"), steps=4, stop_queries=3, stop_every=2,
                         train_rho=0.028, new_ledger=True)
    with pytest.raises(fail(monkeypatch)):
        run_train(config)
    assert list((tmp_path / "out").iterdir()) == []


def test_a_training_run_removes_the_model_scratch_files_of_killed_runs_and_no_others(tmp_path):
    features = _features(tmp_path, _write_days(tmp_path, users=60))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    killed = tmp_path / f".m.npz.{int(gone.stdout)}-{'0' * 32}.tmp"
    running = tmp_path / f".m.npz.{os.getppid()}-{'1' * 32}.tmp"  # pytest's parent: a live process
    killed.write_bytes(b"an unreleased model")
    running.write_bytes(b"another run's model")
    assert main(_train_args(features, tmp_path / "ledger.duckdb", tmp_path / "m.npz")) == 0
    assert _model_scratch(tmp_path) == [running]
    load_model(tmp_path / "m.npz")


def test_the_released_model_keeps_the_callers_umask(tmp_path, umask_022):
    """Released once the ledger is committed: public, as it always was (its report is not)."""
    features = _features(tmp_path, _write_days(tmp_path, users=60))
    assert main(_train_args(features, tmp_path / "ledger.duckdb", tmp_path / "m.npz")) == 0
    assert stat.S_IMODE((tmp_path / "m.npz").stat().st_mode) == 0o644


def test_nothing_noisy_is_printed_before_the_ledger_commit(tmp_path):
    args, crashed, scratch = _crashed_before_commit(tmp_path)
    printed = crashed.stdout + crashed.stderr
    assert "[train] step 8/8" in printed  # the run went through all its accuracy queries (4, 6, 8) ...
    assert "accuracy" not in printed  # ... and printed none of them
    _, _, meta = load_model(scratch)
    assert f"{meta['privacy']['normaliser']:.1f}" not in printed  # nor the noisy user count
    rerun = _train_in_a_child(args)  # after the commit, the re-run prints what it released
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    # Any magnitude: a noisy count divided into a noisy count of correct rows can pass 1 on a small set.
    assert len(re.findall(r"\[train\] step \d+: noisy train accuracy -?\d+\.\d{4}", rerun.stderr)) == 3
    assert f"normaliser {meta['privacy']['normaliser']:.1f} (noisy user count" in rerun.stderr


def test_a_second_training_run_after_a_commit_draws_fresh_noise(tmp_path):
    features = _features(tmp_path, _write_days(tmp_path, users=80))
    ledger = tmp_path / "ledger.duckdb"
    with CuratorStore(ledger):  # the ledger's budget: each run below uses a third of it
        pass
    models = []
    for name in ("a", "b"):
        assert main(_train_args(features, ledger, tmp_path / f"{name}.npz", "--train-rho", "0.009")) == 0
        models.append(load_model(tmp_path / f"{name}.npz")[1]["W"])
    reports = [json.loads((tmp_path / f"{n}.json").read_text()) for n in ("a", "b")]
    assert [r["ledger"]["run_id"] for r in reports] == [1, 2]
    assert not np.allclose(models[0], models[1])  # same data and budgets: only the noise differs


def _number_in(text: str, n: int) -> bool:
    """Whether ``n`` is printed as a number of its own (plain or with thousands commas), not as
    digits inside another number such as 0.2496 or 1,249."""
    forms = "|".join(re.escape(f) for f in {str(n), f"{n:,}"})
    return re.search(rf"(?<![\d.,])(?:{forms})(?!\d|[.,]\d)", text) is not None


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "default"])
def test_train_prints_no_exact_count_of_users(tmp_path, capsys, quiet):
    features = _features(tmp_path, _write_days(tmp_path, users=300))
    n = pq.read_metadata(features).num_rows
    code = main(_train_args(features, tmp_path / "ledger.duckdb", tmp_path / "m.npz", *(["--quiet"] if quiet else [])))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    printed = (captured.out + captured.err).replace(str(tmp_path), "<tmp>")
    assert not _number_in(printed, n), printed  # the users trained on (and in the new ledger)
    assert "run zCDP <=" in printed  # the summary was printed


def test_the_training_report_is_written_0600_under_umask_022(tmp_path):
    features = _features(tmp_path, _write_days(tmp_path, users=60))
    old = os.umask(0o022)
    try:
        assert main(_train_args(features, tmp_path / "ledger.duckdb", tmp_path / "m.npz")) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o600  # its curator_only part is sensitive


def test_features_quiet_prints_no_exact_count(tmp_path, capsys):
    paths = _write_days(tmp_path, users=300)
    code = main(["features", "--input", *map(str, paths), "--out", str(tmp_path / "f.parquet"), "--start",
                 str(_day(0)), "--end", str(_day(3)), "--label-column", "bought", "--label-start", str(_day(4)),
                 "--label-end", str(_day(5)), "--quiet"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    n = pq.read_metadata(tmp_path / "f.parquet").num_rows
    rows = sum(pq.read_metadata(p).num_rows for p in paths)
    text = (printed.out + printed.err).replace(str(tmp_path), "<tmp>")
    assert not _number_in(text, n) and not _number_in(text, rows), text
    assert "f.parquet" in text


def _public_values(node):
    """Every number in a report outside its ``curator_only`` part."""
    if isinstance(node, dict):
        return [v for k, child in node.items() if k != "curator_only" for v in _public_values(child)]
    if isinstance(node, list):
        return [v for child in node for v in _public_values(child)]
    return [node] if isinstance(node, (int, float)) and not isinstance(node, bool) else []


def test_the_training_report_keeps_exact_counts_in_its_curator_only_part(tmp_path):
    paths = _write_days(tmp_path, users=300)
    ledger = tmp_path / "ledger.duckdb"
    run_job(JobConfig(inputs=tuple(paths[:4]), store=str(tmp_path / "releases.duckdb"), ledger=str(ledger),
                      epsilon=1.0, delta=1e-6, norm_budget=3.0, start_window=W0, end_window=W0 + 3, n_shards=4,
                      contract=contract("int64", "opened=0:1", "bought=0:1")))
    features = _features(tmp_path, paths)
    n, in_ledger = pq.read_metadata(features).num_rows, len(_used(ledger))
    assert main(_train_args(features, ledger, tmp_path / "m.npz")) == 0
    report = json.loads((tmp_path / "m.json").read_text())
    public = _public_values(report) + _public_values(load_model(tmp_path / "m.npz")[2])
    assert n not in public and in_ledger not in public and len(_used(ledger)) not in public
    curator = report["curator_only"]
    assert curator["training_rows"] == n and curator["ledger_users"] == len(_used(ledger))
    assert curator["note"].startswith("SENSITIVE")


def test_adding_a_user_without_budget_left_changes_no_model(tmp_path):
    """The update divides by a noisy count of the users with budget, not by the number of rows:
    a user the daily releases exhausted contributes to nothing, the normaliser included."""
    paths = _write_days(tmp_path)
    ledger = tmp_path / "ledger.duckdb"
    run_job(JobConfig(inputs=tuple(paths[:4]), store=str(tmp_path / "releases.duckdb"), ledger=str(ledger),
                      epsilon=1.0, delta=1e-6, norm_budget=3.0, start_window=W0, end_window=W0 + 3, n_shards=4,
                      contract=contract("int64", "opened=0:1", "bought=0:1")))
    with CuratorStore(ledger) as store:
        kappa = store.parameters().rho
    features = _features(tmp_path, paths)
    table = pq.read_table(features)
    spent = [u for u, v in _used(ledger).items() if v >= kappa * (1 - 1e-6)]
    extra = next(u for u in table.column("user_id").to_pylist() if u in spent)
    pq.write_table(table.filter(pa.compute.not_equal(table.column("user_id"), extra)), tmp_path / "without.parquet")
    (tmp_path / "without.parquet").chmod(0o600)  # a curator file, as the features stage writes it
    models = {}
    for name, feats in (("with", features), ("without", tmp_path / "without.parquet")):
        copy = tmp_path / name
        copy.mkdir()
        for f in ("ledger.duckdb", "ledger.noise.key"):
            shutil.copy2(tmp_path / f, copy / f)
        assert main(_train_args(feats, copy / "ledger.duckdb", copy / "m.npz", "--seed", "5")) == 0
        models[name] = load_model(copy / "m.npz")
    for key in models["with"][1]:
        np.testing.assert_allclose(models["with"][1][key], models["without"][1][key], rtol=1e-12, atol=1e-15)
    assert models["with"][2]["privacy"]["normaliser"] == models["without"][2]["privacy"]["normaliser"]


def test_a_public_normaliser_is_what_the_update_divides_by_and_costs_nothing(tmp_path):
    features = _features(tmp_path, _write_days(tmp_path, users=80))
    summary = run_train(TrainConfig(features=str(features), ledger=str(tmp_path / "l.duckdb"), epsilon=1.0,
                                    delta=1e-6, out=str(tmp_path / "m.npz"), steps=3, stopping=False,
                                    normaliser=1000.0, seed=1, train_rho=0.028, new_ledger=True))
    privacy = json.loads((tmp_path / "m.json").read_text())["privacy"]
    assert summary.normaliser == privacy["normaliser"] == 1000.0 and privacy["normaliser_kind"] == "public"
    assert privacy["normaliser_rho"] == 0.0 and privacy["normaliser_noisy_count"] is None


def test_training_on_a_ledger_refuses_another_noise_key_and_never_creates_one(tmp_path, capsys):
    features = _features(tmp_path, _write_days(tmp_path, users=40))
    ledger = tmp_path / "ledger.duckdb"
    args = _train_args(features, ledger, tmp_path / "m.npz", "--train-rho", "0.01")
    assert main(args) == 0
    key = tmp_path / "ledger.noise.key"
    before = _used(ledger)
    key.rename(tmp_path / "elsewhere.key")
    capsys.readouterr()
    assert main(args) == 1
    assert "argument --noise-key: noise key file" in capsys.readouterr().err and not key.exists()
    NoiseKey.load_or_create(key)  # another curator's key in its place
    assert main(args) == 1
    assert "the ledger's own key" in capsys.readouterr().err
    assert _used(ledger) == before
    assert main(args + ["--key", str(tmp_path / "elsewhere.key")]) == 0


def test_the_noisy_count_and_the_accuracy_queries_must_leave_budget_for_the_steps():
    base = {"features": "f", "ledger": "l", "epsilon": 1.0, "delta": 1e-6, "out": "m", "train_rho": 0.01}
    with pytest.raises(ValueError, match="stop_fraction \\+ count_fraction must be < 1"):
        TrainConfig(**base, stop_fraction=0.6, count_fraction=0.4)
    with pytest.raises(ValueError, match="normaliser must be > 0, got normaliser=0"):
        TrainConfig(**base, normaliser=0)
    assert TrainConfig(**base, stop_fraction=0.6, count_fraction=0.4, normaliser=1e5).spent_fraction == 0.6


# -- an input contract: no row's meaning depends on other rows' values (issue 28) ---------------

def _features_file(path: Path, labels, *, x=None, classes: int | None = 2, label_type=pa.int64()) -> Path:
    """A features file as the features job writes one (``user_id``, three features, ``label``, its
    columns and, unless ``classes`` is None, its classes in :data:`FEATURES_KEY`), ``0600``."""
    labels = list(labels)
    rng = np.random.default_rng(len(labels))
    x = rng.uniform(0.0, 1.0, size=(len(labels), 3)) if x is None else x
    meta = {"feature_columns": ["f0", "f1", "f2"], "label": "label", **({"classes": classes} if classes else {})}
    table = pa.table({"user_id": pa.array(np.arange(len(labels), dtype=np.int64)),
                      **{f"f{j}": pa.array(x[:, j], type=pa.float64()) for j in range(3)},
                      "label": pa.array(labels, type=label_type)})
    pq.write_table(table.replace_schema_metadata({FEATURES_KEY: json.dumps(meta)}), path)
    path.chmod(0o600)
    return path


def _labels(n: int = 120) -> list[int]:
    return [int(v) for v in np.random.default_rng(1).integers(0, 2, size=n)]


def _stage(folder: Path, features: Path, *extra: str) -> tuple[int, str, dict, tuple]:
    """``renyi-stream train`` on a new ledger in ``folder``: (exit status, stderr, report, model)."""
    import io
    from contextlib import redirect_stderr

    folder.mkdir(exist_ok=True)
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["train", "--features", str(features), "--ledger", str(folder / "l.duckdb"), "--new-ledger",
                     "--epsilon", "1", "--delta", "1e-6", "--out", str(folder / "m.npz"), "--steps", "3",
                     "--no-stopping", "--seed", "4", "--train-rho", "0.028", *extra])
    if code != 0:
        return code, err.getvalue(), {}, ()
    return code, err.getvalue(), json.loads((folder / "m.json").read_text()), load_model(folder / "m.npz")


def _run_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("[train] run "))


def test_a_label_7_among_0_1_labels_changes_neither_the_models_shape_nor_the_train_line(tmp_path):
    labels = _labels()
    with_7 = _features_file(tmp_path / "with7.parquet", labels[:50] + [7] + labels[50:],
                            x=np.random.default_rng(2).uniform(size=(len(labels) + 1, 3)))
    without = _features_file(tmp_path / "without.parquet", labels,
                             x=np.delete(np.random.default_rng(2).uniform(size=(len(labels) + 1, 3)), 50, axis=0))
    code, err, report, (_, params, meta) = _stage(tmp_path / "a", with_7)
    assert code == 0, err
    _, err_without, _, (_, params_without, _) = _stage(tmp_path / "b", without)
    assert params["W"].shape == (3, 2) and meta["n_classes"] == 2 and meta["classes_declared_by"] == "features file"
    assert _run_line(err) == _run_line(err_without) and ", 2 classes;" in _run_line(err)
    assert report["curator_only"]["label_dead_letters"] == {"label_null": 0, "label_not_integer": 0,
                                                            "label_negative": 0, "label_out_of_range": 1}
    assert report["curator_only"]["training_rows"] == len(labels)
    assert 50 not in _used(tmp_path / "a" / "l.duckdb")  # the dead letter's user is charged nothing
    # the other rows and ids differ only by that user: the same model (the same seed, the same count)
    np.testing.assert_array_equal(params["W"], params_without["W"])


@pytest.mark.parametrize("bad, label_type, reason", [
    (-1, pa.int64(), "label_negative"),
    (2, pa.int64(), "label_out_of_range"),
    (None, pa.int64(), "label_null"),
    (0.5, pa.float64(), "label_not_integer"),
    (float("nan"), pa.float64(), "label_not_integer"),
], ids=["negative", "two", "null", "half", "nan"])
def test_a_label_outside_the_declared_classes_is_its_rows_dead_letter_and_the_run_completes(tmp_path, bad,
                                                                                           label_type, reason):
    labels = _labels()
    features = _features_file(tmp_path / "f.parquet", labels[:10] + [bad] + labels[10:], label_type=label_type)
    code, err, report, (_, params, _) = _stage(tmp_path / "run", features)
    assert code == 0, err
    dead = report["curator_only"]["label_dead_letters"]
    assert dead[reason] == 1 and sum(dead.values()) == 1 and params["W"].shape == (3, 2)
    assert 10 not in _used(tmp_path / "run" / "l.duckdb") and len(_used(tmp_path / "run" / "l.duckdb")) == len(labels)


@pytest.mark.parametrize("value, dtype, reason", [
    (None, "float64", "feature_null"),
    (float("nan"), "float64", "feature_not_finite"),
    (float("-inf"), "float64", "feature_not_finite"),
    (1e39, "float32", "feature_not_finite"),  # finite, but inf in the run's float32
], ids=["null", "nan", "-inf", "1e39-in-float32"])
def test_a_null_or_non_finite_feature_is_its_rows_dead_letter_and_the_run_completes(tmp_path, value, dtype, reason):
    labels = _labels()
    x = np.random.default_rng(3).uniform(size=(len(labels), 3)).astype(object)
    x[10, 1] = value
    features = _features_file(tmp_path / "f.parquet", labels, x=x)
    code, err, report, _ = _stage(tmp_path / "run", features, "--dtype", dtype)
    assert code == 0, err
    dead = report["curator_only"]["feature_dead_letters"]
    assert dead[reason] == 1 and sum(dead.values()) == 1
    assert 10 not in _used(tmp_path / "run" / "l.duckdb")


def test_a_users_1e308_feature_is_dropped_at_each_step_uncharged_and_the_run_completes(tmp_path):
    labels = _labels()
    x = np.random.default_rng(3).uniform(size=(len(labels), 3))
    x[10, 1] = 1e308  # finite in float64: trained on, but its gradient norm overflows at every step
    code, err, report, (_, params, _) = _stage(tmp_path / "run", _features_file(tmp_path / "f.parquet", labels, x=x))
    assert code == 0, err
    assert report["curator_only"]["not_finite"] == [1, 1, 1] and report["curator_only"]["training_rows"] == len(labels)
    assert _used(tmp_path / "run" / "l.duckdb")[10] < min(v for u, v in _used(tmp_path / "run" / "l.duckdb").items()
                                                        if u != 10)  # only the noisy count's charge
    assert all(np.isfinite(v).all() for v in params.values())


def test_the_declared_classes_come_from_the_option_or_the_file_and_never_from_the_labels(tmp_path, capsys):
    labels = _labels()
    recorded = _features_file(tmp_path / "recorded.parquet", labels)
    unrecorded = _features_file(tmp_path / "unrecorded.parquet", labels, classes=None)
    code, err, _, _ = _stage(tmp_path / "a", unrecorded)
    assert code == 2 and "argument --classes: classes must be declared (--classes N, an integer >= 2)" in err, err
    assert not (tmp_path / "a" / "l.duckdb").exists()
    code, err, report, (_, params, meta) = _stage(tmp_path / "b", unrecorded, "--classes", "3")
    assert code == 0, err
    assert params["W"].shape == (3, 3) and meta["classes_declared_by"] == "--classes" and report["n_classes"] == 3
    code, err, _, _ = _stage(tmp_path / "c", recorded, "--classes", "3")
    assert code == 2 and "argument --classes: classes must equal the features file's declared classes=2" in err
    assert "got classes=3" in err and not (tmp_path / "c" / "l.duckdb").exists()
    assert _stage(tmp_path / "d", recorded, "--classes", "2")[0] == 0
    for bad in ("1", "0", "-3"):
        code, err, _, _ = _stage(tmp_path / "e", recorded, "--classes", bad)
        assert code == 2 and f"argument --classes: classes must be an integer >= 2, got classes={bad}" in err
    with pytest.raises(ValueError, match="classes must be an integer >= 2, got classes=True"):
        TrainConfig(features="f", ledger="l", epsilon=1.0, delta=0.1, out="m", classes=True)
