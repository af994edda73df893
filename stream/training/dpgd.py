"""Private gradient descent (Feldman & Zrnic, Algorithm 6) and private gradient descent with
individual filtering (Algorithm 7), in one implementation, charging the shared per-user ledger.

One step ``t`` of both algorithms, for a full batch of ``n`` examples (one per user):

1. per-example gradients ``g_t(x_i)`` of the cross-entropy loss (never materialised: the model
   returns their norms and weighted sums, see :mod:`renyi_stream.stream.training.models`);
2. clip: ``g~_t(x_i) = g_t(x_i) * min(1, bound_i / ||g_t(x_i)||)`` with
   ``bound_i = C`` (Algorithm 6) or ``bound_i = min(C, sqrt(B_i - sum_{j<t} ||g~_j(x_i)||^2))``
   (Algorithm 7), where ``B_i`` is user ``i``'s squared-norm budget for this run;
3. charge user ``i`` ``||g~_t(x_i)||^2 / (2 (sigma C)^2)`` zCDP in the ledger (the Gaussian
   mechanism's individual cost; Proposition 5.2's proof), which never lets a user pass the
   ledger's budget;
4. noise: ``g~_t = (sum_i g~_t(x_i) + N(0, sigma^2 C^2 I)) / N``; step ``theta -= eta g~_t``.
   ``N`` is a public normaliser (:mod:`renyi_stream.stream.training.normaliser`), never the exact number of
   users ``n``: under add/remove-one-user neighbours ``n`` is private. The paper's ``1 / n`` is
   ``normaliser=n`` where ``n`` is public (its experiments: a fixed data set, replace-one).

Units: ``C`` in gradient-norm units; ``sigma`` (``noise_multiplier``) dimensionless, the noise
std per coordinate of the *sum* is ``sigma C``; budgets in zCDP ``rho`` (ledger units) or, for
``B_norm``, in squared gradient norm. Guarantees: Algorithm 6 is ``k / (2 sigma^2)``-zCDP
(Proposition 5.1); Algorithm 7 is ``B_norm / (2 sigma^2 C^2)``-zCDP whatever ``k_max``
(Proposition 5.2).

**One ledger.** With a ledger shared with the streaming pipeline, user ``i``'s budget for this
run is ``B_i = min(B_norm, 2 sigma^2 C^2 (kappa - used_i - reserve))``: users who spent budget
in daily releases have less left for training, and the ledger caps the sum of everything at
``kappa``. ``reserve`` is what the Appendix A stopping rule's accuracy queries may cost.

**Algorithm 7 reproduces Algorithm 6.** The filter's state is kept in units of ``C^2``
(``u_i = sum_j ||g~_j(x_i)||^2 / C^2``, budget ``b_i = B_i / C^2``). A gradient clipped at ``C``
adds exactly ``1.0``, and sums of terms ``<= 1`` rounded to nearest never pass the integer step
count, so with ``B_norm = k C^2`` (``k C^2 / C^2`` exact in float64) and ``k_max = k`` the clip
bound is exactly ``C`` at every step of every user and both modes produce bit-identical iterates
from the same generator (tested). Calibrate ``sigma`` with :func:`noise_multiplier_for`, whose
``1e-8`` relative headroom keeps rounded-up charges below the ledger's cap.
"""

from __future__ import annotations

import math
import secrets
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting.calibration import NOISE_HEADROOM
from renyi_stream.stream.ledger import Policy
from renyi_stream.stream.noise import InsecureNoiseWarning
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.models import Model, Params, augmented_sq_norms
from renyi_stream.stream.training.normaliser import check_normaliser
from renyi_stream.stream.training.stopping import AccuracyStopping, private_accuracy
from renyi_stream.stream.xp import array_module, to_host

# The per-user run budget derived from the ledger is shrunk by this relative amount, so that the
# ledger's rounded-up charges (each up by ~1e-12 relative) still fit what is left.
_LEDGER_SHRINK = 1.0 - 1e-9

# Default slice of the batch on the CPU, in bytes of ``x``. A step reads ``x`` twice (logits,
# then the weighted gradient sum); done slice by slice, the second read finds the slice still in
# cache, and the model's intermediates ((rows, hidden) arrays) are slice-sized instead of
# batch-sized. Measured at n = 200k, d = 784, float32 on 2 cores (benchmarks/bench_dpgd.py,
# medians): logistic regression 0.177 -> 0.158 s/step, MLP (256 hidden) 1.04-1.34 -> 0.87-0.89
# s/step; slices of 8k to 16k rows (25 to 50 MB) were equally good. On a GPU the whole batch is
# one slice.
_CHUNK_BYTES = 32 << 20
_MIN_CHUNK_ROWS = 1024  # below this the per-slice Python overhead (ledger charge included) shows
# On a device, a model that keeps much per row (the CNN: about 39 KB in float32) is sliced so that
# this much of it is held at once: 60,000 MNIST rows are one slice.
_DEVICE_CHUNK_BYTES = 4 << 30


def default_chunk_rows(n: int, n_features: int, dtype: Any, xp: Any = np, row_bytes: int | None = None) -> int:
    """Rows per slice that :func:`private_gd` uses when ``chunk_rows`` is not given: about
    ``_CHUNK_BYTES`` of ``x`` on NumPy (at least ``_MIN_CHUNK_ROWS``, at most ``n``), the whole
    batch on CuPy. ``row_bytes``: what the model keeps per row until its weighted sum, when that
    is more than a row of ``x`` (the CNN's stored per-example pieces, ``SampleConvNet.row_bytes``):
    the slice is then sized by it on NumPy, and on CuPy capped at ``_DEVICE_CHUNK_BYTES``."""
    width = max(1, int(n_features)) * np.dtype(dtype).itemsize
    if xp is not np:
        if row_bytes is None:
            return max(1, int(n))
        return max(1, min(int(n), _DEVICE_CHUNK_BYTES // max(1, int(row_bytes))))
    rows = _CHUNK_BYTES // max(width, int(row_bytes or 0))
    return max(1, min(int(n), max(_MIN_CHUNK_ROWS, int(rows))))


def _int_at_least(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


@dataclass(frozen=True)
class GDConfig:
    """Hyperparameters of Algorithm 6 (``filtering=False``) or Algorithm 7 (``filtering=True``).

    Attributes:
        clip: ``C`` > 0, the per-example gradient clip (L2, gradient units).
        noise_multiplier: ``sigma`` > 0; the noise added to the summed clipped gradients is
            ``N(0, sigma^2 C^2 I)``.
        learning_rate: ``eta`` > 0, constant step size.
        steps: ``k`` >= 1. Algorithm 6: the number of steps. Algorithm 7: sets ``B_norm = k C^2``
            unless ``norm_budget`` is given.
        filtering: ``False`` for Algorithm 6, ``True`` for Algorithm 7.
        norm_budget: ``B_norm`` > 0 (Algorithm 7 only), each user's squared-norm budget for the
            run; default ``k C^2``.
        max_steps: ``k_max`` >= 1 (Algorithm 7 only), steps to run; default ``k``. A stopping
            rule (:class:`~renyi_stream.stream.training.stopping.AccuracyStopping`) ends the run at its last
            query instead.
    """

    clip: float
    noise_multiplier: float
    learning_rate: float
    steps: int
    filtering: bool = False
    norm_budget: float | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        check.positive("clip", self.clip)
        check.positive("noise_multiplier", self.noise_multiplier)
        check.positive("learning_rate", self.learning_rate)
        _int_at_least("steps", self.steps, 1)
        if not isinstance(self.filtering, bool):
            raise ValueError(f"filtering must be a bool, got filtering={self.filtering!r}")
        if self.norm_budget is not None:
            if not self.filtering:
                raise ValueError("norm_budget is a parameter of Algorithm 7: set filtering=True, "
                                 f"got norm_budget={self.norm_budget!r} with filtering=False")
            check.positive("norm_budget", self.norm_budget)
        if self.max_steps is not None:
            if not self.filtering:
                raise ValueError("max_steps is a parameter of Algorithm 7 (Algorithm 6 runs `steps` steps): "
                                 f"set filtering=True, got max_steps={self.max_steps!r} with filtering=False")
            _int_at_least("max_steps", self.max_steps, 1)

    @property
    def budget_steps(self) -> float:
        """``B_norm / C^2``: the budget in steps at the full clip (``k`` for Algorithm 6)."""
        if self.norm_budget is None:
            return float(self.steps)
        return self.norm_budget / (self.clip * self.clip)

    @property
    def total_steps(self) -> int:
        """Steps the run takes without a stopping rule: ``k`` or ``k_max``."""
        return self.steps if self.max_steps is None else self.max_steps

    @property
    def noise_std(self) -> float:
        """``sigma C``: Gaussian noise std per coordinate of the summed clipped gradients."""
        return self.noise_multiplier * self.clip

    @property
    def rho(self) -> float:
        """zCDP of the run per user: ``k / (2 sigma^2)`` (Prop. 5.1) or ``B_norm / (2 sigma^2 C^2)``
        (Prop. 5.2), without the stopping rule's queries."""
        return self.budget_steps / (2.0 * self.noise_multiplier**2)


def noise_multiplier_for(*, steps: float, rho: float) -> float:
    """``sigma`` such that ``steps`` full-clip steps cost ``rho`` zCDP: ``sqrt(steps / (2 rho))``
    (Proposition 5.1 solved for ``sigma``), raised by ``NOISE_HEADROOM`` (1e-8 relative) so that the
    rounded-up charges of ``steps`` steps fit under the ledger's cap."""
    steps = check.positive("steps", steps)
    rho = check.positive("rho", rho)
    return math.sqrt(steps / (2.0 * rho)) * (1.0 + NOISE_HEADROOM)


@dataclass(frozen=True)
class TrainingData:
    """A full batch on one device: features ``x`` ``(n, d)``, integer labels ``(n,)``, their
    one-hot transposed ``(K, n)`` and ``||x_i||^2 + 1`` (float64). Build with :func:`prepare_data`."""

    x: Any
    labels: Any
    onehot_t: Any
    x_sq_norms: Any
    n_classes: int

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.x.shape[1])


def prepare_data(x: Any, labels: Any, *, n_classes: int, xp: Any = np, dtype: Any = np.float64) -> TrainingData:
    """Move ``x`` (``(n, d)``, finite in ``dtype``) and ``labels`` (``(n,)`` integers in
    ``[0, n_classes)``) to ``xp`` (``numpy`` or ``cupy``) in ``dtype``. ``n_classes`` (>= 2) is
    declared by the caller, never derived from the labels: the model's shape is public."""
    k = _int_at_least("n_classes", n_classes, 2)
    x_host = to_host(x)
    y_host = to_host(labels)
    # n = 0 is allowed: a run over nobody (every row left out) trains on noise alone, so whether a
    # model comes out never depends on whether one user's row is there.
    if x_host.ndim != 2 or x_host.shape[1] < 1:
        raise ValueError(f"x must be a 2-d array (n, d) with d >= 1, got shape={x_host.shape}")
    if y_host.shape != (x_host.shape[0],):
        raise ValueError(f"labels must have shape ({x_host.shape[0]},), got shape={y_host.shape}")
    if y_host.dtype.kind not in "iu":
        raise ValueError(f"labels must be integers, got dtype {y_host.dtype}")
    with np.errstate(over="ignore"):  # a value past float32's range becomes inf here, refused below
        x_cast = np.asarray(x_host, dtype=dtype)
    if not np.isfinite(x_cast).all():
        raise ValueError(f"x must be finite (no NaN or inf) in dtype {np.dtype(dtype).name}")
    if y_host.size and (y_host.min() < 0 or y_host.max() >= k):
        raise ValueError(f"labels must be in [0, {k}), got labels in [{y_host.min()}, {y_host.max()}]")
    xd = xp.asarray(x_cast)
    yd = xp.asarray(y_host.astype(np.int64))
    onehot_t = xp.zeros((k, x_host.shape[0]), dtype=dtype)
    onehot_t[yd, xp.arange(x_host.shape[0])] = 1
    return TrainingData(x=xd, labels=yd, onehot_t=onehot_t, x_sq_norms=augmented_sq_norms(xd), n_classes=k)


def training_generators(seed: int | None = None) -> tuple[np.random.Generator, np.random.Generator]:
    """Two independent generators (gradient noise, accuracy-query noise), Philox-based.

    ``seed=None`` (production): keyed from 128 bits of ``secrets``. An integer seed gives
    reproducible runs for tests and experiments, and warns :class:`InsecureNoiseWarning`:
    anyone who knows the seed can remove the noise.
    """
    if seed is None:
        root = np.random.SeedSequence(secrets.randbits(128))
    else:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer or None, got seed={seed!r}")
        warnings.warn("training noise from a public seed: the trained model is not private "
                      "(use seed=None in production)", InsecureNoiseWarning, stacklevel=2)
        root = np.random.SeedSequence(int(seed))
    grad_seq, query_seq = root.spawn(2)
    return np.random.Generator(np.random.Philox(grad_seq)), np.random.Generator(np.random.Philox(query_seq))


@dataclass(frozen=True)
class StepReport:
    """What a progress callback sees after step ``step``.

    ``noisy_accuracy`` is a released value (public). ``params`` is the iterate, a
    post-processing of released noisy gradients. ``weights`` (the per-example clip factors) is
    curator-only: never log or publish it.
    """

    step: int
    total_steps: int
    seconds: float
    rho_bound: float  # worst-case zCDP spent by any user so far in this run
    noisy_accuracy: float | None
    params: Params
    weights: Any


@dataclass
class TrainResult:
    """The outcome of :func:`private_gd`.

    Attributes:
        params: the returned model: the best queried iterate under a stopping rule, else the last.
        final_params: the last iterate.
        steps_run: steps taken.
        chosen_step: the step whose iterate is ``params``.
        accuracy_queries: ``(step, noisy training accuracy)`` pairs released by the stopping rule.
        rho: zCDP bound of the run per user (gradient steps + reserved queries).
        curator: per-step counts (sensitive, curator-only): ``clipped`` (gradients scaled to
            their bound), ``budget_bound`` (bound below ``C`` because of the user's budget),
            ``exhausted`` (bound 0: filtered out), ``ledger_scaled`` (scaled by the ledger's cap),
            ``not_finite`` (gradient or its norm not finite: dropped for the step, charged nothing).
    """

    params: Params
    final_params: Params
    steps_run: int
    chosen_step: int
    accuracy_queries: list[tuple[int, float]]
    rho: float
    curator: dict[str, list[int]] = field(default_factory=dict)


def _copy(params: Params) -> Params:
    return {k: v.copy() for k, v in params.items()}


def run_budget_steps(config: GDConfig, ledger: TrainingLedger, reserve: float) -> Any:
    """``b_i = B_i / C^2``: each row's squared-norm budget for the run in units of ``C^2``,
    ``min(B_norm / C^2, 2 sigma^2 (remaining_i - reserve))`` (at least 0)."""
    xp = array_module(ledger.used)
    left = xp.maximum(ledger.remaining() - reserve, 0.0)
    from_ledger = (2.0 * config.noise_multiplier**2) * left * _LEDGER_SHRINK
    return xp.minimum(from_ledger, config.budget_steps)


def private_gd(
    model: Model,
    data: TrainingData,
    *,
    config: GDConfig,
    ledger: TrainingLedger,
    rng: np.random.Generator,
    query_rng: np.random.Generator | None = None,
    stopping: AccuracyStopping | None = None,
    init_params: Params | None = None,
    init_rng: np.random.Generator | None = None,
    chunk_rows: int | None = None,
    progress: Callable[[StepReport], None] | None = None,
    normaliser: float,
) -> TrainResult:
    """Run Algorithm 6 or 7 on ``data`` (one row per user, in ``ledger``'s row order).

    Args:
        model: :class:`~renyi_stream.stream.training.models.LogisticRegression`, ``MLP`` or
            :class:`~renyi_stream.stream.training.cnn.SampleConvNet`.
        data: the full batch (:func:`prepare_data`), on the device the run uses.
        config: the algorithm and its hyperparameters (:class:`GDConfig`).
        ledger: the users' budgets; charged in place at every step and query.
        normaliser: ``N`` > 0, what the noisy gradient sum is divided by (and the accuracy
            queries' counts): a public constant or a released noisy count
            (:mod:`renyi_stream.stream.training.normaliser`), never the exact number of rows unless that is
            public. The iterates depend on the rows only through the noisy sums and ``N``: a row
            whose user contributes nothing (no budget left) changes nothing.
        rng: generator of the gradient noise (:func:`training_generators`).
        query_rng: generator of the accuracy queries' noise (default: spawned from ``rng``).
        stopping: Appendix A's rule; the run then ends at its last query and returns the best
            queried iterate. Its queries' cost is reserved from every user's budget first.
        init_params: starting point ``theta_1`` (default: ``model.init_params`` with ``init_rng``).
        chunk_rows: process the batch in slices of this many rows (same result up to float
            summation order; bounds the memory of the intermediates). Each slice is charged to
            the ledger before its weighted sum is taken; the filter's decision for a user reads
            only that user's state and norm, so slicing changes decisions only through the
            rounding of the norms (each slice's norms bound what that slice contributes). Default
            (:func:`default_chunk_rows`, with the model's ``row_bytes`` where it has one):
            cache-sized slices on NumPy, one slice on CuPy (a few for a model that keeps much per
            row); pass ``chunk_rows=data.n`` for one slice.
        progress: called after every step with a :class:`StepReport`.

    A user whose per-example gradient (or its norm) is not finite at a step (an overflowing
    example) is dropped for that step: charged nothing, and masked out of the sum (the model's
    ``weighted_sum``), so the others' step is what it would be without them.

    Raises ``ValueError`` before any charge when the run cannot fit: sizes differ, or the
    run's zCDP (``config.rho`` plus the stopping rule's reserve) exceeds the ledger budget; and
    after the run, returning nothing, when it diverged: the parameters were not finite after a
    step (the message also says at how many steps every user's gradient norm was not finite;
    such steps alone are counted in ``curator["not_finite"]``, never refused).

    Host traffic on a device (tested with ``renyi_stream.stream.testing.strict_xp``): a gradient step moves
    nothing from the device to the host; it uploads its noise, one array per parameter, drawn
    on the host from ``rng`` so that a seeded run draws the same noise on NumPy and CuPy. Each
    accuracy query makes two transfers (its input check and the count it releases), and the
    run reads its curator counts once, at the end.
    """
    if data.n != len(ledger):
        raise ValueError(f"data and ledger must have the same rows, got n={data.n} rows and {len(ledger)} ledger rows")
    reserve = 0.0 if stopping is None else stopping.rho_per_user
    if config.rho + reserve > ledger.budget:
        raise ValueError(
            f"the run needs {config.rho + reserve:.6g} zCDP per user (steps: {config.rho:.6g}, accuracy "
            f"queries: {reserve:.6g}), more than the ledger budget kappa={ledger.budget:.6g}; raise "
            "noise_multiplier (see noise_multiplier_for) or lower steps / norm_budget")
    if stopping is not None and config.max_steps is not None and config.max_steps < stopping.last_step:
        raise ValueError(f"max_steps must be >= the stopping rule's last query step {stopping.last_step}, "
                         f"got max_steps={config.max_steps}")
    if chunk_rows is not None:
        _int_at_least("chunk_rows", chunk_rows, 1)
    normaliser = check_normaliser(normaliser)
    total = stopping.last_step if stopping is not None else config.total_steps
    xp = array_module(data.x)
    params = _copy(init_params) if init_params is not None else model.init_params(
        data.n_features, data.n_classes, init_rng or np.random.default_rng(0), xp, data.x.dtype)
    query_rng = query_rng if query_rng is not None else rng.spawn(1)[0]

    n = data.n
    clip, sigma = float(config.clip), float(config.noise_multiplier)
    noise_std = config.noise_std
    budget = run_budget_steps(config, ledger, reserve) if config.filtering else None
    spent = xp.zeros(n)  # u_i: sum of ||g~_j(x_i)||^2 / C^2 in this run
    if chunk_rows is None:
        row_bytes = model.row_bytes(data.x.dtype) if hasattr(model, "row_bytes") else None
        chunk_rows = default_chunk_rows(n, data.n_features, data.x.dtype, xp, row_bytes=row_bytes)
    # At least one slice, empty when n = 0: the step's sum is then the model's zero gradient.
    slices = [slice(s, min(s + chunk_rows, n)) for s in range(0, n, chunk_rows)] or [slice(0, 0)]
    counts: dict[str, list[int]] = {"clipped": [], "budget_bound": [], "exhausted": [], "ledger_scaled": [],
                                    "not_finite": []}
    queries: list[tuple[int, float]] = []
    best: tuple[float, int, Params] | None = None
    started = time.perf_counter()

    # Per step: the curator counts, then the parameter entries that are not finite after the step
    # (the model diverged). Kept on the device and read once, after the run, so that a step makes
    # no host round trip.
    tallies = xp.zeros((total, len(counts) + 1), dtype=xp.int64)
    # A user whose gradient overflows is dropped and counted (not_finite), so NumPy's overflow warnings
    # would only say, on the console, that some user's data is extreme.
    with np.errstate(over="ignore", invalid="ignore"):
        for step in range(1, total + 1):
            grads: Params | None = None
            weights = xp.empty(n)
            for rows in slices:
                pe = model.per_example(params, data.x[rows], data.onehot_t[:, rows], data.x_sq_norms[rows])
                norm = xp.sqrt(pe.sq_norms)
                norm /= clip  # ||g_i|| / C
                finite = xp.isfinite(norm)  # not finite: dropped for this step, charged nothing
                if budget is None:  # Algorithm 6: bound C
                    bound = xp.ones_like(norm)
                else:  # Algorithm 7: bound min(C, sqrt(B_i - sum ||g~||^2)) / C
                    bound = xp.minimum(xp.sqrt(xp.maximum(budget[rows] - spent[rows], 0.0)), 1.0)
                over = norm > bound
                over &= finite
                contribution = xp.where(finite, xp.where(over, bound, norm), 0.0)  # ||g~_t(x_i)|| / C
                # validate=False: the contributions are finite and >= 0 by construction.
                scale = ledger.charge(contribution, noise_std=sigma, policy=Policy.CLIP, rows=rows, validate=False)
                safe_norm = xp.where(norm > 0, norm, 1.0)
                w = xp.where(finite, xp.where(over, bound / safe_norm, 1.0) * scale, 0.0)
                contributed = contribution * scale
                spent[rows] += contributed * contributed
                weights[rows] = w
                part = pe.weighted_sum(w)
                del pe  # frees the slice's (rows, hidden) intermediates before the next slice allocates
                if grads is None:
                    grads = part
                else:
                    for k in grads:
                        grads[k] += part[k]
                tallies[step - 1, :-1] += xp.stack([xp.count_nonzero(over), xp.count_nonzero(bound < 1.0),
                                                    xp.count_nonzero(bound == 0.0), xp.count_nonzero(scale < 1.0),
                                                    xp.count_nonzero(~finite)])
            assert grads is not None
            for k, p in params.items():
                noise = xp.asarray(rng.standard_normal(p.shape) * noise_std, dtype=p.dtype)
                g = grads[k]
                g += noise
                p -= (config.learning_rate / normaliser) * g
            tallies[step - 1, -1] = xp.stack([xp.count_nonzero(~xp.isfinite(p)) for p in params.values()]).sum()

            noisy_acc = None
            if stopping is not None and stopping.is_query_step(step):
                predictions = xp.argmax(model.logits(params, data.x), axis=1)
                noisy_acc = private_accuracy(predictions == data.labels, ledger, noise_std=stopping.noise_std,
                                             rng=query_rng, normaliser=normaliser)
                queries.append((step, noisy_acc))
                if best is None or noisy_acc > best[0]:
                    best = (noisy_acc, step, _copy(params))
            if progress is not None:
                progress(StepReport(step=step, total_steps=total, seconds=time.perf_counter() - started,
                                    rho_bound=min(step, config.budget_steps) / (2.0 * sigma**2),
                                    noisy_accuracy=noisy_acc, params=params, weights=weights))

    table = to_host(tallies)  # the run's one transfer of its counts
    # not_finite for every row: no user's step (a run over nobody has no such step)
    everyone = np.flatnonzero(table[:, len(counts) - 1] == n) if n else np.zeros(0, dtype=np.int64)
    params_lost = np.flatnonzero(table[:, -1])
    # Only parameters that are not finite stop the run: the clipped contributions are finite, so
    # that is the learning rate or the noise, never one user. Every user's gradient not finite at
    # a step with finite parameters is only said (curator_only.not_finite): with one user in the
    # run, stopping then would hinge on that user's features (issue 37, item 1).
    if params_lost.size:
        why = []
        if everyone.size:
            why.append(f"per-example gradient norms were NaN at {everyone.size} step(s), first at step "
                       f"{int(everyone[0]) + 1}, for every user (each was dropped and charged nothing)")
        if params_lost.size:
            why.append(f"the parameters were not finite after step {int(params_lost[0]) + 1}")
        raise ValueError("the run diverged: " + "; ".join(why) + "; lower learning_rate")
    for i, key in enumerate(counts):
        counts[key] = [int(v) for v in table[:, i]]
    chosen_params, chosen_step = (best[2], best[1]) if best is not None else (params, total)
    return TrainResult(params=chosen_params, final_params=params, steps_run=total, chosen_step=chosen_step,
                       accuracy_queries=queries, rho=config.rho + reserve, curator=counts)


def accuracy(model: Model, params: Params, x: Any, labels: Any) -> float:
    """Plain (non-private) accuracy, for evaluation on held-out data only."""
    xp = array_module(params[next(iter(params))])
    xd = xp.asarray(x, dtype=params[next(iter(params))].dtype)
    pred = xp.argmax(model.logits(params, xd), axis=1)
    return float(to_host((pred == xp.asarray(labels)).mean()))
