"""The batch training stage: filtered DP gradient descent charged to the curator's ledger.

``renyi-stream train --features F --ledger L --epsilon E --delta D ...`` trains a model on one row
per user (:mod:`pipelines.features`) with private gradient descent (Feldman & Zrnic,
Algorithm 6) or private gradient descent with individual filtering (Algorithm 7, the default),
charging every user's gradient steps and accuracy queries to the **same** per-user zCDP ledger
that the daily job charges. A user's guarantee therefore covers the daily releases and the
trained model together: everything they took part in sums to at most ``kappa``.

Order of a run (each step safe to crash after):

1. take the run lock (one run per ledger at a time) and open the ledger database;
2. on an existing ledger, refuse an ``(epsilon, delta)`` or accounting that differs from the one
   it was started with; on a new one, record the parameters (and create its noise key) so a
   later daily job can continue on it;
3. train (:func:`stream.training.dpgd.private_gd`), reading each user's remaining budget once;
4. write the model to a temporary file, commit the charged ledger in one DuckDB transaction,
   then move the model into place and write the report. A crash before the commit charges
   nobody and publishes nothing; after it, the charge stands (the safe direction).

What the progress lines print is public: the step, the worst-case zCDP spent so far, and the
noisy accuracies the stopping rule released. The report's ``curator_only`` section (per-step
counts of clipped and filtered users) is sensitive and must stay with the ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np
import pyarrow as pa

from stream.accounting import ACCOUNTINGS, calibrate, describe_accounting, epsilon_for_budget
from stream.accounting import _validate as check

DEFAULT_STOP_FRACTION = 0.05


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Privacy numbers are keyword-only in spirit: every field is named.

    Attributes:
        features: Parquet file of :func:`pipelines.features.materialise_features` (or any Parquet
            with ``user_id``, numeric features and an integer ``label``).
        ledger: the curator's ledger database (DuckDB); created when missing.
        epsilon, delta: the per-user promise; must equal the ledger's.
        out: the model file (``.npz``); report: the JSON report (default: ``out`` with ``.json``).
        model: ``logreg`` or ``mlp`` (``hidden`` units).
        clip: ``C`` > 0; steps: ``k`` >= 1 full-clip steps (``B_norm = k C^2``); learning_rate: ``eta``.
        noise_multiplier: ``sigma``; default calibrated so ``k`` steps cost the training budget.
        filtering: Algorithm 7 (default) or Algorithm 6.
        stopping: Appendix A's rule (Algorithm 7 only): ``stop_queries`` private accuracy queries
            every ``stop_every`` steps from step ``k``, costing ``stop_fraction`` of the training
            budget; keep the best queried iterate.
        train_rho: zCDP per user this run may use (default: the ledger's whole budget ``kappa``);
            users who spent some of ``kappa`` in daily releases get less (Algorithm 7's clip).
        accounting: ``(epsilon, delta) -> kappa`` conversion; default the ledger's (``gdp`` on a
            new ledger).
        norm_budget: only on a new ledger: the squared-norm budget ``B`` recorded for later daily
            jobs on it (they must pass the same ``--norm-budget``).
        seed: an integer makes the noise reproducible and the model NOT private (warns).
        device: ``cpu`` (NumPy) or ``gpu`` (CuPy); dtype: ``float64`` or ``float32``.
    """

    features: str
    ledger: str
    epsilon: float
    delta: float
    out: str
    report: str | None = None
    model: str = "logreg"
    hidden: int = 64
    clip: float = 1.0
    steps: int = 50
    learning_rate: float = 1.0
    noise_multiplier: float | None = None
    filtering: bool = True
    stopping: bool = True
    stop_queries: int = 8
    stop_every: int = 5
    stop_fraction: float = DEFAULT_STOP_FRACTION
    train_rho: float | None = None
    accounting: str | None = None
    norm_budget: float = 1.0
    seed: int | None = None
    device: str = "cpu"
    dtype: str = "float64"

    def __post_init__(self) -> None:
        check.positive("epsilon", self.epsilon)
        check.probability("delta", self.delta)
        if self.model not in ("logreg", "mlp"):
            raise ValueError(f"model must be 'logreg' or 'mlp', got model={self.model!r}")
        for name in ("hidden", "steps", "stop_queries", "stop_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
        check.positive("clip", self.clip)
        check.positive("learning_rate", self.learning_rate)
        check.positive("norm_budget", self.norm_budget)
        if self.noise_multiplier is not None:
            check.positive("noise_multiplier", self.noise_multiplier)
        if self.train_rho is not None:
            check.positive("train_rho", self.train_rho)
        if not 0.0 < check.real("stop_fraction", self.stop_fraction) < 1.0:
            raise ValueError(f"stop_fraction must be in (0, 1), got stop_fraction={self.stop_fraction!r}")
        if self.stopping and not self.filtering:
            raise ValueError("stopping (Appendix A) extends Algorithm 7 past k steps: it needs filtering=True "
                             "(use --no-stopping with --no-filtering)")
        if self.accounting is not None and self.accounting not in ACCOUNTINGS:
            raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got accounting={self.accounting!r}")
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got device={self.device!r}")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype must be 'float64' or 'float32', got dtype={self.dtype!r}")

    @property
    def report_path(self) -> Path:
        return Path(self.report) if self.report else Path(self.out).with_suffix(".json")


@dataclass(frozen=True)
class TrainSummary:
    """What a run did (public numbers only; the report file has the curator-only ones)."""

    model_path: Path
    report_path: Path
    run_id: int
    users: int
    steps_run: int
    chosen_step: int
    ledger_rho: float
    run_rho: float
    noise_multiplier: float
    accuracy_queries: list[tuple[int, float]]
    seconds: float


class TrainRefused(RuntimeError):
    """The ledger cannot be trained on as asked (other promise, other id type, locked)."""


def _array_module(device: str) -> Any:
    if device == "cpu":
        return np
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError("device='gpu' needs CuPy: pip install 'renyi-stream[gpu]'") from exc
    return cupy


def _ledger_parameters(curator: Any, config: TrainConfig, id_type: str) -> Any:
    """The ledger's recorded parameters, after checking this run's promise against them; on a
    new ledger, the parameters to record (compatible with a later ``renyi-stream run``)."""
    from pipelines.curator_store import LedgerParameters
    from pipelines.daily_job import DEFAULT_SHARDS
    from stream.noise import NoiseKey
    from stream.schema import WindowSpec

    existing = curator.parameters()
    if existing is not None:
        different = [
            f"{name}: ledger has {getattr(existing, name)!r}, this training asks {wanted!r}"
            for name, wanted in (("epsilon", config.epsilon), ("delta", config.delta),
                                 ("accounting", config.accounting or existing.accounting),
                                 ("id_type", id_type))
            if getattr(existing, name) != wanted
        ]
        if different:
            raise TrainRefused(
                f"the ledger {config.ledger} was started with another promise; a training run must use "
                "the ledger's own (it shares every user's budget with the daily releases): " + "; ".join(different))
        return existing
    accounting = config.accounting or "gdp"
    cal = calibrate(epsilon=config.epsilon, delta=config.delta, norm_budget=config.norm_budget,
                    accounting=accounting)
    key_path = Path(config.ledger).with_name(Path(config.ledger).stem + ".noise.key")  # as JobConfig does
    key = NoiseKey.load_or_create(key_path)
    window = WindowSpec()
    wanted = LedgerParameters(
        epsilon=cal.epsilon, delta=cal.delta, norm_budget=cal.norm_budget, accounting=cal.accounting,
        rho=cal.rho, noise_std=cal.noise_std, tracker_step=cal.rho / 32.0, id_type=id_type,
        n_shards=DEFAULT_SHARDS, key_fingerprint=key.fingerprint,
        window_seconds=window.length_seconds, origin_seconds=window.origin_seconds,
    )
    return curator.check_or_record_parameters(wanted)


def _empty(schema: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({name: pa.array([], type=t) for name, t in schema.items()})


def _commit_ledger(curator: Any, ledger_table: pa.Table, previous_users: int) -> int:
    """Write the charged ledger in one transaction through ``CuratorStore.commit_run`` with no
    releases, window counts or dead letters (a training run reads no stream rows)."""
    from queries.release_store import RELEASE_SCHEMA

    run_id = curator.next_run_id()
    curator.commit_run(
        run_id=run_id, ledger=ledger_table, releases=RELEASE_SCHEMA.empty_table(),
        window_counts=_empty({"window_id": pa.int64(), "admitted": pa.int64(), "clipped": pa.int64(),
                              "dropped": pa.int64()}),
        run_counts={"rows_read": 0, "admitted": 0, "clipped": 0, "dropped": 0, "rejected": 0, "late": 0},
        dead_letters=_empty({"source": pa.string(), "row_index": pa.int64(), "reason": pa.string(),
                             "detail": pa.string(), "raw": pa.string()}),
        previous_users=previous_users,
    )
    return run_id


def run_train(config: TrainConfig, progress: TextIO | None = None) -> TrainSummary:
    """Run one training stage end to end; see the module docstring for the order of steps."""
    from pipelines.curator_store import CuratorStore, CuratorStoreError, RunLock
    from pipelines.features import load_features
    from stream.ledger import Ledger
    from stream.training.budget import TrainingLedger
    from stream.training.dpgd import GDConfig, noise_multiplier_for, prepare_data, private_gd, training_generators
    from stream.training.models import make_model, save_model
    from stream.training.stopping import AccuracyStopping

    started = time.perf_counter()
    say: Callable[[str], Any] = (lambda m: (progress.write(m + "\n"), progress.flush())) if progress else (lambda m: None)
    feats = load_features(config.features)
    id_type = "string" if (pa.types.is_string(feats.user_ids.type) or pa.types.is_large_string(feats.user_ids.type)) \
        else "int64"
    xp = _array_module(config.device)
    model = make_model(config.model, hidden=config.hidden)
    out = Path(config.out)
    for name, path in (("out", out), ("report", config.report_path)):  # before anyone is charged
        if path.is_dir():
            raise ValueError(f"{name} must be a file to write, got the folder {name}={str(path)!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with RunLock(config.ledger), CuratorStore(config.ledger) as curator:
            params = _ledger_parameters(curator, config, id_type)
            kappa = params.rho
            train_rho = kappa if config.train_rho is None else config.train_rho
            if train_rho > kappa:
                raise ValueError(f"train_rho must be <= the ledger budget kappa={kappa:.6g}, got train_rho={train_rho!r}")
            previous = curator.load_ledger(params)
            ledger = Ledger.from_arrow(previous)
            view = TrainingLedger.from_ledger(ledger, feats.user_ids, xp=xp)
            reserve = config.stop_fraction * train_rho if config.stopping else 0.0
            sigma = config.noise_multiplier or noise_multiplier_for(steps=config.steps, rho=train_rho - reserve)
            gd = GDConfig(clip=config.clip, noise_multiplier=sigma, learning_rate=config.learning_rate,
                          steps=config.steps, filtering=config.filtering)
            stopping = AccuracyStopping.with_reserve(
                first_step=AccuracyStopping.after_budget_steps(gd.budget_steps), rho=reserve,
                queries=config.stop_queries, every=config.stop_every) if config.stopping else None
            data = prepare_data(feats.x, feats.labels, n_classes=feats.n_classes, xp=xp, dtype=config.dtype)
            algorithm = "Algorithm 7 (private GD with individual filtering)" if config.filtering \
                else "Algorithm 6 (private GD)"
            say(f"[train] {algorithm}, {config.model}, {data.n:,} users x {data.n_features} features, "
                f"{feats.n_classes} classes; ledger kappa={kappa:.6g} zCDP ({params.accounting}), this run "
                f"<= {gd.rho + (stopping.rho_per_user if stopping else 0.0):.6g}; sigma={sigma:.4g}, C={config.clip:g}")

            def report_step(rep: Any) -> None:
                acc = "" if rep.noisy_accuracy is None else f"  noisy train accuracy {rep.noisy_accuracy:.4f}"
                say(f"[train] step {rep.step}/{rep.total_steps}  gradient rho <= {rep.rho_bound:.6g}  "
                    f"{rep.seconds:.1f} s{acc}")

            rng, query_rng = training_generators(config.seed)  # warns when seeded: not private
            init_rng = np.random.default_rng(0 if config.seed is None else config.seed)
            result = private_gd(model, data, config=gd, ledger=view, rng=rng, query_rng=query_rng,
                                stopping=stopping, init_rng=init_rng, progress=report_step)
            merged = view.merged_ledger()
            tmp = out.with_name(out.name + ".tmp")
            accounting = params.accounting
            privacy = {
                "epsilon": params.epsilon, "delta": params.delta, "accounting": accounting,
                "accounting_description": describe_accounting(accounting),
                "ledger_rho": kappa, "train_rho": train_rho, "run_rho": result.rho,
                "run_epsilon_alone": epsilon_for_budget(rho=min(result.rho, kappa), delta=params.delta,
                                                        accounting=accounting),
                "noise_multiplier": sigma, "noise_std": gd.noise_std, "clip": config.clip,
                "norm_budget_B_norm": gd.budget_steps * config.clip**2,
                "accuracy_query_noise_std": stopping.noise_std if stopping else None,
                "guarantee": "every user's total charge in the ledger (daily releases + this training) "
                             f"is <= kappa={kappa:.6g} zCDP, i.e. ({params.epsilon:g}, {params.delta:g})-DP "
                             f"under '{accounting}' accounting; the run alone is <= run_rho (Prop. 5.1/5.2)",
                "insecure_seed": config.seed is not None,
            }
            save_model(tmp, model, result.params, {
                "feature_columns": list(feats.feature_columns), "n_classes": feats.n_classes,
                "algorithm": algorithm, "privacy": privacy})
            try:
                run_id = _commit_ledger(curator, merged.to_arrow(), previous.num_rows)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            os.replace(tmp, out)
    except CuratorStoreError as exc:
        raise TrainRefused(str(exc)) from exc
    seconds = time.perf_counter() - started
    report = {
        "renyi_stream.training_report": 1,
        "algorithm": algorithm + ", Feldman & Zrnic",
        "model": model.config(), "model_path": str(out), "features": str(config.features),
        "rows": data.n, "feature_columns": list(feats.feature_columns), "n_classes": feats.n_classes,
        "privacy": privacy,
        "hyperparameters": {"clip": config.clip, "steps_k": config.steps, "learning_rate": config.learning_rate,
                            "noise_multiplier": sigma, "filtering": config.filtering,
                            "stopping": None if stopping is None else asdict(stopping), "dtype": config.dtype,
                            "device": config.device},
        "steps_run": result.steps_run, "chosen_step": result.chosen_step,
        "accuracy_queries": [{"step": s, "noisy_train_accuracy": a} for s, a in result.accuracy_queries],
        "ledger": {"path": str(config.ledger), "run_id": run_id, "users": merged.to_arrow().num_rows},
        "seconds": seconds,
        "curator_only": {
            "note": "sensitive: per-step counts of users whose gradient was clipped, bounded by their "
                    "remaining budget, filtered out (bound 0) or scaled by the ledger cap. Keep with the ledger.",
            **result.curator,
        },
    }
    config.report_path.parent.mkdir(parents=True, exist_ok=True)
    config.report_path.write_text(json.dumps(report, indent=2))
    return TrainSummary(model_path=out, report_path=config.report_path, run_id=run_id, users=data.n,
                        steps_run=result.steps_run, chosen_step=result.chosen_step, ledger_rho=kappa,
                        run_rho=result.rho, noise_multiplier=sigma, accuracy_queries=result.accuracy_queries,
                        seconds=seconds)


# -- command line ---------------------------------------------------------------------------------


def _features_command(args: argparse.Namespace) -> int:
    from pipelines.features import materialise_features
    from pipelines.readers import InputFileError

    try:
        summary = materialise_features(
            args.input, args.out, start=args.start, end=args.end, label_column=args.label_column,
            label_start=args.label_start, label_end=args.label_end)
    except (ValueError, InputFileError) as exc:
        from pipelines.cli import name_the_option

        print(f"renyi-stream features: error: {name_the_option('features', str(exc), args)}", file=sys.stderr)
        return 2 if not isinstance(exc, InputFileError) else 1
    print(f"wrote {summary.users:,} users x {len(summary.feature_columns)} features to {summary.path} "
          f"({summary.rows_read:,} rows read, {summary.rows_rejected:,} rejected)")
    return 0


def _train_command(args: argparse.Namespace) -> int:
    try:
        config = TrainConfig(
            features=args.features, ledger=args.ledger, epsilon=args.epsilon, delta=args.delta, out=args.out,
            report=args.report, model=args.model, hidden=args.hidden, clip=args.clip, steps=args.steps,
            learning_rate=args.learning_rate, noise_multiplier=args.noise_multiplier,
            filtering=args.filtering, stopping=args.stopping and args.filtering,
            stop_queries=args.stop_queries, stop_every=args.stop_every, stop_fraction=args.stop_fraction,
            train_rho=args.train_rho, accounting=args.accounting, norm_budget=args.norm_budget,
            seed=args.seed, device=args.device, dtype=args.dtype,
        )
        summary = run_train(config, progress=None if args.quiet else sys.stderr)
    except ValueError as exc:
        from pipelines.cli import name_the_option

        print(f"renyi-stream train: error: {name_the_option('train', str(exc), args)}", file=sys.stderr)
        return 2
    except (TrainRefused, ImportError) as exc:
        from pipelines.cli import name_the_option

        print(f"renyi-stream train: error: {name_the_option('train', str(exc), args)}", file=sys.stderr)
        return 1
    best = ""
    if summary.accuracy_queries:
        best = f"; kept step {summary.chosen_step} (best of {len(summary.accuracy_queries)} noisy accuracy queries)"
    print(f"trained on {summary.users:,} users in {summary.steps_run} steps{best}; run zCDP <= {summary.run_rho:.6g} "
          f"of the ledger's {summary.ledger_rho:.6g} per user")
    print(f"model: {summary.model_path}; report: {summary.report_path}; ledger run {summary.run_id}; "
          f"{summary.seconds:.1f} s")
    return 0


def add_train_subcommand(subparsers: Any) -> None:
    """Register ``features`` and ``train`` on the ``renyi-stream`` command's subparsers."""
    feat = subparsers.add_parser(
        "features",
        help="curator side: one training row per user (features + label) from the daily indicator files",
        description="Aggregate the daily indicator files per user: per indicator the mean per day and the share "
        "of active days over [--start, --end], and label = 1 if --label-column is non-zero in "
        "[--label-start, --label-end]. Writes Parquet (sensitive: keep it with the ledger).",
    )
    feat.add_argument("--input", nargs="+", required=True, help="daily indicator files (Parquet, Arrow IPC, CSV)")
    feat.add_argument("--out", required=True, help="features Parquet file to write")
    feat.add_argument("--start", required=True, help="first day of the feature window (YYYY-MM-DD)")
    feat.add_argument("--end", required=True, help="last day of the feature window (YYYY-MM-DD)")
    feat.add_argument("--label-column", required=True, help="indicator whose later presence is the label")
    feat.add_argument("--label-start", required=True, help="first day of the label window (YYYY-MM-DD)")
    feat.add_argument("--label-end", required=True, help="last day of the label window (YYYY-MM-DD)")
    feat.set_defaults(handler=_features_command)

    train = subparsers.add_parser(
        "train",
        help="private gradient descent (Feldman & Zrnic Alg. 6/7) charged to the ledger's per-user budgets",
        description="Train logistic regression or a one-hidden-layer MLP with private full-batch gradient "
        "descent. Algorithm 7 (default) clips each user's gradient to what is left of their own budget in the "
        "ledger shared with the daily job, so a user's promise covers daily releases and the model together.",
    )
    train.add_argument("--features", required=True, help="features Parquet (user_id, features, integer label)")
    train.add_argument("--ledger", required=True, help="the curator's ledger (DuckDB); created when missing")
    train.add_argument("--epsilon", type=float, required=True, help="per-user epsilon (> 0); must equal the ledger's")
    train.add_argument("--delta", type=float, required=True, help="per-user delta in (0, 1); must equal the ledger's")
    train.add_argument("--out", required=True, help="model file to write (.npz)")
    train.add_argument("--report", default=None, help="training report (JSON; default: --out with .json)")
    train.add_argument("--model", choices=("logreg", "mlp"), default="logreg", help="default logreg")
    train.add_argument("--hidden", type=int, default=64, help="MLP hidden units (default 64)")
    train.add_argument("--clip", type=float, default=1.0, help="C: per-user gradient clip, L2 (default 1)")
    train.add_argument("--steps", type=int, default=50, help="k: full-clip steps, B_norm = k C^2 (default 50)")
    train.add_argument("--learning-rate", type=float, default=1.0, help="eta (default 1)")
    train.add_argument("--noise-multiplier", type=float, default=None,
                       help="sigma (noise std sigma*C on the summed gradient); default: calibrated to the budget")
    train.add_argument("--no-filtering", dest="filtering", action="store_false",
                       help="Algorithm 6 (plain private GD) instead of Algorithm 7")
    train.add_argument("--no-stopping", dest="stopping", action="store_false",
                       help="no Appendix A accuracy queries: stop after k steps")
    train.add_argument("--stop-queries", type=int, default=8, help="Appendix A: accuracy queries (default 8)")
    train.add_argument("--stop-every", type=int, default=5, help="Appendix A: steps between queries (default 5)")
    train.add_argument("--stop-fraction", type=float, default=DEFAULT_STOP_FRACTION,
                       help=f"share of the training budget for the queries (default {DEFAULT_STOP_FRACTION})")
    train.add_argument("--train-rho", type=float, default=None,
                       help="zCDP per user this run may use (default: the ledger's whole budget)")
    train.add_argument("--accounting", choices=ACCOUNTINGS, default=None,
                       help="default: the ledger's (gdp on a new ledger)")
    train.add_argument("--norm-budget", type=float, default=1.0,
                       help="new ledger only: the B later daily jobs on it must use (default 1)")
    train.add_argument("--seed", type=int, default=None, help="reproducible noise: NOT private (warns)")
    train.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="gpu needs CuPy")
    train.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="default float64")
    train.add_argument("--quiet", action="store_true", help="no progress lines")
    train.set_defaults(handler=_train_command)
