"""The batch training stage: filtered DP gradient descent charged to the curator's ledger.

``renyi-stream train --features F --ledger L --epsilon E --delta D ...`` trains a model on one row
per user (:mod:`renyi_stream.pipelines.curator.features`) with private gradient descent (Feldman & Zrnic,
Algorithm 6) or private gradient descent with individual filtering (Algorithm 7, the default),
charging every user's gradient steps and accuracy queries to the **same** per-user zCDP ledger
that the daily job charges. A user's guarantee therefore covers the daily releases and the
trained model together: everything they took part in sums to at most ``kappa``.

Order of a run (each step safe to crash after):

1. take the run lock (one run per ledger at a time) and open the ledger database;
2. on an existing ledger, refuse an ``(epsilon, delta)`` or accounting that differs from the one
   it was started with, and load its noise key (never create one: a missing key or another
   key than the ledger's is refused); a ledger that does not exist is refused unless the run
   asks for a new one (``new_ledger``, ``--new-ledger``): then record the parameters and create
   its noise key beside it, as the daily job does, so a later daily job can continue on it;
3. train (:func:`renyi_stream.stream.training.dpgd.private_gd`), reading each user's remaining budget once,
   with noise derived from the key, the ledger and the run id the training will commit as
   (:mod:`renyi_stream.stream.training.keyed_noise`);
4. write the model to a private scratch file (``0600``, removed on any failure:
   :func:`renyi_stream.stream.private_files.private_scratch`), commit the charged ledger in one DuckDB
   transaction, then move the model into place with the caller's umask's mode (it is released),
   print the released noisy values and write the report.

**Released once.** A crash before the commit charges nobody and has printed nothing noisy; the
re-run starts from the same ledger state, so it commits as the same run id, draws the same
noise and releases the same model and values: invariant 5 (release-once, docs/architecture.md).
After the commit the charge stands (the safe direction), and the next training draws fresh noise.

**Declared, never inferred.** The number of classes (the model's shape) is ``--classes`` or the
features file's record, never the labels; a row whose label is outside them, or whose feature is
null or not finite in the run's dtype, is left out of the run (charged nothing) and counted by
reason in the report's ``curator_only`` part (:func:`renyi_stream.pipelines.curator.features.load_features`).
A user whose gradient overflows at a step is dropped for that step (:func:`renyi_stream.stream.training.dpgd.private_gd`).

**Charged what the curator declares.** A run may charge each user at most ``train_rho``, which
the curator declares (``--train-rho``): there is no default, and in particular never the whole
remaining budget. A ledger path that does not exist is never silently created (a typo would train
on a fresh ledger that charges nobody's real budget): only a run that asks for a new ledger makes
one.

**No exact counts.** The neighbouring relation is add/remove one user, so the number of users
is private. The update divides by a public normaliser (``--normaliser``) or, by default, by a
noisy count of the users charged to the ledger (:mod:`renyi_stream.stream.training.normaliser`). Before the
commit the progress lines print only the step, the worst-case zCDP spent so far and the time;
after it, the released noisy count and accuracies. Nothing printed carries an exact count. The
report's ``curator_only`` section (exact users, per-step counts of clipped and filtered users)
is sensitive and must stay with the ledger.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np
import pyarrow as pa

from renyi_stream.stream.accounting import ACCOUNTINGS, DEFAULT_ACCOUNTING, describe_accounting, epsilon_for_budget
from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.engine.dead_letters import DEAD_LETTER_SCHEMA
from renyi_stream.stream.private_files import private_scratch, public_file_mode, write_private_bytes

DEFAULT_STOP_FRACTION = 0.05
# Share of the run's budget the default normaliser (a noisy count of the users) costs. At the
# demo run of docs/training.md (train_rho = 0.005) its noise std is 100 users: 0.14% of 72,864.
DEFAULT_COUNT_FRACTION = 0.01


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Privacy numbers are keyword-only in spirit: every field is named.

    Attributes:
        features: Parquet file of the features job (:func:`renyi_stream.pipelines.features.job.materialise_features`) (or any Parquet
            with ``user_id``, numeric features and an integer ``label``).
        classes: the number of classes ``N`` >= 2 (labels ``0 .. N-1``), declared: default the
            features file's record (the features job records 2); never read off the labels. A
            row whose label is outside them is left out and counted (curator-only).
        ledger: the curator's ledger database (DuckDB). One that does not exist is refused
            unless ``new_ledger``.
        epsilon, delta: the per-user promise; must equal the ledger's.
        out: the model file (``.npz``); report: the JSON report (default: ``out`` with ``.json``).
        model: ``logreg``, ``mlp`` (``hidden`` units) or ``cnn`` (Opacus's MNIST network:
            the features must be 784 pixel columns, a 28x28 image row-major; refused otherwise
            before anyone is charged).
        clip: ``C`` > 0; steps: ``k`` >= 1 full-clip steps (``B_norm = k C^2``); learning_rate: ``eta``.
        noise_multiplier: ``sigma``; default calibrated so ``k`` steps cost the training budget.
        filtering: Algorithm 7 (default) or Algorithm 6.
        stopping: Appendix A's rule (Algorithm 7 only): ``stop_queries`` private accuracy queries
            every ``stop_every`` steps from step ``k``, costing ``stop_fraction`` of the training
            budget; keep the best queried iterate.
        train_rho: zCDP per user this run may charge, declared by the curator (required: no
            default; at most the ledger's budget ``kappa``); users who have less of ``kappa`` left
            are charged what they have left (Algorithm 7's clip).
        new_ledger: start a new ledger at ``ledger`` when none exists there (its first run); an
            existing ledger is used as it is.
        accounting: ``(epsilon, delta) -> kappa`` conversion; default the ledger's (``gdp`` on a
            new ledger).
        norm_budget: only on a new ledger: the squared-norm budget ``B`` recorded for later daily
            jobs on it (they must pass the same ``--norm-budget``).
        key_path: the curator's noise key file (default: beside the ledger, as the daily job's).
        normaliser: a public number (> 0) the update and the accuracy queries divide by, declared
            by the curator and not computed from the data; default ``None``: a noisy count of the
            users, costing ``count_fraction`` of the run's budget (:mod:`renyi_stream.stream.training.normaliser`).
        count_fraction: share of the run's budget for that count, in (0, 1).
        seed: an integer makes the noise reproducible and the model NOT private (warns).
        device: ``cpu`` (NumPy) or ``gpu`` (CuPy); dtype: ``float64`` or ``float32``.
    """

    features: str
    ledger: str
    epsilon: float
    delta: float
    out: str
    report: str | None = None
    classes: int | None = None
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
    key_path: str | None = None
    normaliser: float | None = None
    count_fraction: float = DEFAULT_COUNT_FRACTION
    seed: int | None = None
    device: str = "cpu"
    dtype: str = "float64"
    new_ledger: bool = False

    def __post_init__(self) -> None:
        check.positive("epsilon", self.epsilon)
        check.probability("delta", self.delta)
        if self.classes is not None and (isinstance(self.classes, bool) or not isinstance(self.classes, int)
                                         or self.classes < 2):
            raise ValueError(f"classes must be an integer >= 2, got classes={self.classes!r}")
        if self.model not in ("logreg", "mlp", "cnn"):
            raise ValueError(f"model must be 'logreg', 'mlp' or 'cnn', got model={self.model!r}")
        for name in ("hidden", "steps", "stop_queries", "stop_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
        check.positive("clip", self.clip)
        check.positive("learning_rate", self.learning_rate)
        check.positive("norm_budget", self.norm_budget)
        if self.noise_multiplier is not None:
            check.positive("noise_multiplier", self.noise_multiplier)
        if self.train_rho is None:
            raise ValueError("train_rho must be declared: the zCDP per user this run may charge, > 0 and at most "
                             "the ledger's budget kappa; there is no default (it was the whole remaining budget), "
                             "got train_rho=None")
        check.positive("train_rho", self.train_rho)
        if not 0.0 < check.real("stop_fraction", self.stop_fraction) < 1.0:
            raise ValueError(f"stop_fraction must be in (0, 1), got stop_fraction={self.stop_fraction!r}")
        if self.normaliser is not None:
            check.positive("normaliser", self.normaliser)
        if not 0.0 < check.real("count_fraction", self.count_fraction) < 1.0:
            raise ValueError(f"count_fraction must be in (0, 1), got count_fraction={self.count_fraction!r}")
        if self.spent_fraction >= 1.0:
            raise ValueError("stop_fraction + count_fraction must be < 1 (the rest is for the gradient steps), "
                             f"got stop_fraction={self.stop_fraction!r} + count_fraction={self.count_fraction!r}")
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

    @property
    def key_file(self) -> Path:
        """The noise key file: ``key_path``, or ``<ledger stem>.noise.key`` beside the ledger (the
        daily job's default, ``JobConfig.resolved_key_path``)."""
        ledger = Path(self.ledger)
        return Path(self.key_path) if self.key_path else ledger.with_name(ledger.stem + ".noise.key")

    @property
    def spent_fraction(self) -> float:
        """Share of the run's budget reserved before the gradient steps: the stopping rule's
        queries and the noisy count (each only when used)."""
        stop = self.stop_fraction if self.stopping else 0.0
        return stop + (self.count_fraction if self.normaliser is None else 0.0)


@dataclass(frozen=True)
class TrainSummary:
    """What a run did. Every field is public but ``users`` (the exact number of training rows:
    curator-only, never printed or published)."""

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
    normaliser: float
    normaliser_kind: str  # "noisy count" (released by this run) or "public" (declared)


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


def _key_refused(config: TrainConfig, existing_fingerprint: str, exc: Exception | None,
                 found: str | None) -> TrainRefused:
    why = str(exc) if exc is not None else (
        f"noise key file {config.key_file} is key {found}, but the ledger {config.ledger} was started with key "
        f"{existing_fingerprint}")
    return TrainRefused(f"{why}; training noise must come from the ledger's own key (so a re-run after a crash "
                        "releases the same model): pass the curator's key file for this ledger with --key")


def _existing_key(config: TrainConfig, params: Any) -> Any:
    """An existing ledger's noise key: loaded from ``config.key_file``, never created (a new key
    would not be the one the ledger was started with), and refused unless its fingerprint is the
    ledger's."""
    from renyi_stream.stream.noise import NoiseKey, NoiseKeyError

    try:
        key = NoiseKey.load(config.key_file)
    except NoiseKeyError as exc:
        raise _key_refused(config, params.key_fingerprint, exc, None) from exc
    if key.fingerprint != params.key_fingerprint:
        raise _key_refused(config, params.key_fingerprint, None, key.fingerprint)
    return key


def _ledger_parameters(curator: Any, config: TrainConfig, id_type: str) -> tuple[Any, Any]:
    """The ledger's configuration (:class:`renyi_stream.stream.engine.ledger_config.LedgerConfig`), after
    checking this run's promise against it (:meth:`LedgerConfig.continued_from`: the epsilon,
    delta, accounting and id type a training run gives; the rest is the ledger's), and ``None``;
    on a new ledger, the configuration to record (compatible with a later ``renyi-stream run``)
    and the new key created beside the ledger (``NoiseKey.load_or_create``, as the daily job
    does). An existing ledger's key is loaded later (:func:`_existing_key`), after the parameter
    checks, so a bad parameter is reported as such."""
    from dataclasses import replace

    from renyi_stream.stream.engine.ledger_config import LedgerConfig, LedgerConfigError
    from renyi_stream.stream.noise import NoiseKey

    existing = curator.parameters()
    if existing is not None:
        asked = replace(existing, epsilon=config.epsilon, delta=config.delta,
                        accounting=config.accounting or existing.accounting, id_type=id_type)
        try:
            return asked.continued_from(existing, where=f"the ledger {config.ledger}", by="this training"), None
        except LedgerConfigError as exc:
            raise TrainRefused(
                f"the ledger {config.ledger} was started with another promise; a training run must use the "
                "ledger's own (it shares every user's budget with the daily releases): " + "; ".join(exc.details)
            ) from None
    key = NoiseKey.load_or_create(config.key_file)
    wanted = LedgerConfig.from_promise(
        epsilon=config.epsilon, delta=config.delta, norm_budget=config.norm_budget,
        accounting=config.accounting or DEFAULT_ACCOUNTING, id_type=id_type, key_fingerprint=key.fingerprint,
        ledger_id=curator.ledger_id)
    return curator.check_or_record_parameters(wanted), key


def _empty(schema: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({name: pa.array([], type=t) for name, t in schema.items()})


def _commit_ledger(curator: Any, run_id: int, ledger_table: pa.Table, previous_users: int) -> None:
    """Write the charged ledger as run ``run_id`` in one transaction through
    ``CuratorStore.commit_run`` with no releases, window counts or dead letters (a training run
    reads no stream rows)."""
    from renyi_stream.queries.release_store import RELEASE_SCHEMA

    curator.commit_run(
        run_id=run_id, ledger=ledger_table, releases=RELEASE_SCHEMA.empty_table(),
        window_counts=_empty({"window_id": pa.int64(), "admitted": pa.int64(), "clipped": pa.int64(),
                              "dropped": pa.int64()}),
        run_counts={"rows_read": 0, "admitted": 0, "clipped": 0, "dropped": 0, "rejected": 0, "late": 0},
        dead_letters=DEAD_LETTER_SCHEMA.empty_table(),
        previous_users=previous_users,
    )


@dataclass(frozen=True)
class _Normaliser:
    """The run's normaliser: its value, how it was obtained, and what it cost per user."""

    value: float
    kind: str  # "noisy count" or "public"
    noise_std: float | None
    rho: float
    released: float | None  # the noisy count as released (before the floor at 1)

    def describe(self) -> str:
        if self.kind == "public":
            return f"public normaliser {self.value:g}"
        return f"normaliser {self.value:.1f} (noisy user count, noise std {self.noise_std:.3g})"


def _release_normaliser(config: TrainConfig, view: Any, train_rho: float, rng: Any) -> _Normaliser:
    """The declared public normaliser, or a noisy count of the users charged to ``view`` (each
    user ``1 / (2 s^2)`` zCDP with ``s`` spending ``count_fraction`` of the run's budget)."""
    from renyi_stream.stream.training.normaliser import count_noise_std, normaliser_from_count, private_count

    if config.normaliser is not None:
        return _Normaliser(value=float(config.normaliser), kind="public", noise_std=None, rho=0.0, released=None)
    rho = config.count_fraction * train_rho
    std = count_noise_std(rho)
    released = private_count(view, noise_std=std, rng=rng)
    return _Normaliser(value=normaliser_from_count(released), kind="noisy count", noise_std=std, rho=rho,
                       released=released)


def refuse_a_missing_ledger(config: TrainConfig) -> None:
    """TrainRefused, naming the path and ``--new-ledger``, when ``config.ledger`` does not exist
    and the run did not ask for a new ledger: a mistyped path must never become a fresh ledger in
    which every user has their whole budget (the model would be charged to nobody's real budget).
    Checked before anything is created (the lock file, the folders, the model)."""
    if not config.new_ledger and not Path(config.ledger).exists():
        raise TrainRefused(
            f"the ledger {config.ledger} does not exist: a training run charges the ledger the daily job charges, "
            "and a new one would start every user at their whole budget. Give the curator's ledger with --ledger, "
            "or --new-ledger to start a new ledger with this run")


def run_train(config: TrainConfig, progress: TextIO | None = None) -> TrainSummary:
    """Run one training stage end to end; see the module docstring for the order of steps."""
    from renyi_stream.pipelines.curator.store import CuratorStore, CuratorStoreError, RunLock
    from renyi_stream.pipelines.curator.features import FEATURE_DEAD_LETTERS, LABEL_DEAD_LETTERS, load_features
    from renyi_stream.stream.ledger import Ledger
    from renyi_stream.stream.training.budget import TrainingLedger
    from renyi_stream.stream.training.dpgd import GDConfig, noise_multiplier_for, prepare_data, private_gd
    from renyi_stream.stream.training.keyed_noise import keyed_training_noise, seeded_training_noise
    from renyi_stream.stream.training.models import make_model, save_model
    from renyi_stream.stream.training.stopping import AccuracyStopping

    started = time.perf_counter()
    say: Callable[[str], Any] = (lambda m: (progress.write(m + "\n"), progress.flush())) if progress else (lambda m: None)
    feats = load_features(config.features, classes=config.classes, dtype=config.dtype)
    if config.model == "cnn":  # its input is an image: refused before anything is created or charged
        from renyi_stream.stream.training.cnn import check_width

        check_width(len(feats.feature_columns))
    id_type = "string" if (pa.types.is_string(feats.user_ids.type) or pa.types.is_large_string(feats.user_ids.type)) \
        else "int64"
    xp = _array_module(config.device)
    model = make_model(config.model, hidden=config.hidden)
    out = Path(config.out)
    for name, path in (("out", out), ("report", config.report_path)):  # before anyone is charged
        if path.is_dir():
            raise ValueError(f"{name} must be a file to write, got the folder {name}={str(path)!r}")
    refuse_a_missing_ledger(config)  # before anything is created
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        # The model goes to a private scratch file (0600), removed on any failure before its release.
        with RunLock(config.ledger), CuratorStore(config.ledger) as curator, private_scratch(out) as tmp:
            params, key = _ledger_parameters(curator, config, id_type)
            kappa = params.rho
            train_rho = config.train_rho
            if train_rho > kappa:
                raise ValueError(f"train_rho must be <= the ledger budget kappa={kappa:.6g}, got train_rho={train_rho!r}")
            key = key or _existing_key(config, params)
            # The run id this training commits as: a re-run after a crash before the commit finds
            # the same one, so it draws the same noise; a committed run moves it on.
            run_id = curator.next_run_id()
            noise = seeded_training_noise(config.seed) if config.seed is not None else \
                keyed_training_noise(key, ledger=curator.ledger_id, run_id=run_id)
            previous = curator.load_ledger(params)
            ledger = Ledger.from_arrow(previous)
            view = TrainingLedger.from_ledger(ledger, feats.user_ids, xp=xp)
            reserve = config.stop_fraction * train_rho if config.stopping else 0.0
            count_rho = config.count_fraction * train_rho if config.normaliser is None else 0.0
            sigma = config.noise_multiplier or noise_multiplier_for(steps=config.steps,
                                                                    rho=train_rho - reserve - count_rho)
            gd = GDConfig(clip=config.clip, noise_multiplier=sigma, learning_rate=config.learning_rate,
                          steps=config.steps, filtering=config.filtering)
            stopping = AccuracyStopping.with_reserve(
                first_step=AccuracyStopping.after_budget_steps(gd.budget_steps), rho=reserve,
                queries=config.stop_queries, every=config.stop_every) if config.stopping else None
            run_bound = gd.rho + (stopping.rho_per_user if stopping else 0.0) + count_rho
            if run_bound > kappa:  # before the count charges anyone (private_gd checks the rest)
                raise ValueError(f"noise_multiplier must leave room for the run in the ledger budget: the run needs "
                                 f"{run_bound:.6g} zCDP per user, more than kappa={kappa:.6g}; got "
                                 f"noise_multiplier={sigma!r}")
            data = prepare_data(feats.x, feats.labels, n_classes=feats.n_classes, xp=xp, dtype=config.dtype)
            algorithm = "Algorithm 7 (private GD with individual filtering)" if config.filtering \
                else "Algorithm 6 (private GD)"
            normaliser_plan = f"public normaliser {config.normaliser:g}" if config.normaliser is not None \
                else f"normaliser: a noisy user count ({config.count_fraction:g} of the run's budget)"
            say(f"[train] run {run_id}: {algorithm}, {config.model}, {data.n_features} features, "
                f"{feats.n_classes} classes; ledger kappa={kappa:.6g} zCDP ({params.accounting}), this run "
                f"<= {run_bound:.6g}; sigma={sigma:.4g}, C={config.clip:g}; {normaliser_plan}")

            def report_step(rep: Any) -> None:  # no noisy value before the commit: see the module docstring
                say(f"[train] step {rep.step}/{rep.total_steps}  gradient rho <= {rep.rho_bound:.6g}  "
                    f"{rep.seconds:.1f} s")

            normaliser = _release_normaliser(config, view, train_rho, noise.count)
            init_rng = np.random.default_rng(0 if config.seed is None else config.seed)  # public: no data
            result = private_gd(model, data, config=gd, ledger=view, rng=noise.gradient, query_rng=noise.accuracy,
                                stopping=stopping, init_rng=init_rng, progress=report_step,
                                normaliser=normaliser.value)
            merged = view.merged_ledger()
            accounting = params.accounting
            run_rho = result.rho + normaliser.rho
            privacy = {
                "epsilon": params.epsilon, "delta": params.delta, "accounting": accounting,
                "accounting_description": describe_accounting(accounting),
                "neighbouring": "add or remove one user (all of their records)",
                "ledger_rho": kappa, "train_rho": train_rho, "run_rho": run_rho,
                "run_epsilon_alone": epsilon_for_budget(rho=min(run_rho, kappa), delta=params.delta,
                                                        accounting=accounting),
                "noise_multiplier": sigma, "noise_std": gd.noise_std, "clip": config.clip,
                "norm_budget_B_norm": gd.budget_steps * config.clip**2,
                "accuracy_query_noise_std": stopping.noise_std if stopping else None,
                "normaliser": normaliser.value, "normaliser_kind": normaliser.kind,
                "normaliser_noisy_count": normaliser.released, "normaliser_noise_std": normaliser.noise_std,
                "normaliser_rho": normaliser.rho,
                "guarantee": "every user's total charge in the ledger (daily releases + this training) "
                             f"is <= kappa={kappa:.6g} zCDP, i.e. ({params.epsilon:g}, {params.delta:g})-DP "
                             f"under '{accounting}' accounting; the run alone is <= run_rho (Prop. 5.1/5.2, "
                             "plus the noisy count and accuracy queries)",
                "insecure_seed": config.seed is not None,
            }
            save_model(tmp, model, result.params, {
                "feature_columns": list(feats.feature_columns), "n_classes": feats.n_classes,
                "classes_declared_by": feats.classes_from, "algorithm": algorithm, "privacy": privacy})
            _commit_ledger(curator, run_id, merged.to_arrow(), previous.num_rows)
            os.chmod(tmp, public_file_mode())  # released: the umask's mode, as a model has always had
            os.replace(tmp, out)
    except CuratorStoreError as exc:
        raise TrainRefused(str(exc)) from exc
    # Committed: the noisy values below are released, once (a re-run would have printed the same).
    say(f"[train] released: {normaliser.describe()}")
    for step, value in result.accuracy_queries:
        say(f"[train] step {step}: noisy train accuracy {value:.4f}")
    seconds = time.perf_counter() - started
    report = {
        "renyi_stream.training_report": 1,
        "algorithm": algorithm + ", Feldman & Zrnic",
        "model": model.config(), "model_path": str(out), "features": str(config.features),
        "feature_columns": list(feats.feature_columns), "n_classes": feats.n_classes,
        "classes_declared_by": feats.classes_from,
        "privacy": privacy,
        "hyperparameters": {"clip": config.clip, "steps_k": config.steps, "learning_rate": config.learning_rate,
                            "noise_multiplier": sigma, "filtering": config.filtering,
                            "stopping": None if stopping is None else asdict(stopping), "dtype": config.dtype,
                            "device": config.device, "normaliser": config.normaliser,
                            "count_fraction": config.count_fraction if config.normaliser is None else None},
        "steps_run": result.steps_run, "chosen_step": result.chosen_step,
        "accuracy_queries": [{"step": s, "noisy_train_accuracy": a} for s, a in result.accuracy_queries],
        "ledger": {"path": str(config.ledger), "run_id": run_id},
        "seconds": seconds,
        "curator_only": {
            "note": "SENSITIVE, keep with the ledger, never publish: exact counts (training rows, users in "
                    "the ledger, rows left out by reason (charged nothing), and per step the users whose "
                    "gradient was clipped, bounded by their remaining budget, filtered out (bound 0), "
                    "scaled by the ledger cap or not finite (dropped for the step, charged nothing)).",
            "training_rows": data.n, "ledger_users": merged.to_arrow().num_rows,
            "feature_dead_letters": {k: feats.dead_letters[k] for k in FEATURE_DEAD_LETTERS},
            "label_dead_letters": {k: feats.dead_letters[k] for k in LABEL_DEAD_LETTERS},
            **result.curator,
        },
    }
    # Its curator_only part holds exact counts: a curator file, 0600 whatever the umask.
    write_private_bytes(config.report_path, json.dumps(report, indent=2).encode("utf-8"))
    return TrainSummary(model_path=out, report_path=config.report_path, run_id=run_id, users=data.n,
                        steps_run=result.steps_run, chosen_step=result.chosen_step, ledger_rho=kappa,
                        run_rho=run_rho, noise_multiplier=sigma, accuracy_queries=result.accuracy_queries,
                        seconds=seconds, normaliser=normaliser.value, normaliser_kind=normaliser.kind)
