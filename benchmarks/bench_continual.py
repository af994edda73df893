"""Benchmark: utility of running totals under individual accounting (issue 9).

One command, one run::

    python benchmarks/bench_continual.py                     # 20k users x 365 days, 1000 draws
    python benchmarks/bench_continual.py --chart benchmarks/out/continual.png

A generated stream: ``--users`` users x ``--days`` days, one binary indicator per user-day, on
with probability ``--rate`` independently. Promise ``(epsilon, delta) = (1, 1e-5)`` per user over
the whole stream, GDP accounting (``stream.accounting.calibrate``). For each strategy the
running total through every day is released and compared with the truth:

* (a)  window sums: release each day's sum, add them up (``C = I``, ``B = A``);
* (b)  the square-root factorisation ``C = B = A^{1/2}`` (the default);
* (c)  the binary tree with least-squares post-processing;
* (a') window sums under worst-case accounting (a user active every day: ``||C 1||^2 = T``);
* (b') the square-root factorisation under worst-case accounting (``||C 1||^2 ~ 2 T^2 / pi``),
  for the record: why nobody releases user-level running totals this way.

(a), (b), (c) run through :class:`stream.continual.RunningState` and one
:class:`stream.ledger.Ledger` each, policy ``drop`` (Algorithm 3), day by day: exactly what a
shard of the pipeline does. (a') and (b') run the same code with the worst-case norm budget, so
nobody can be filtered.

The norm budget. Under the individual filter a user is never filtered iff their total squared
query norm over the stream, ``||C x_i||^2 = sum_t ||q_t(x_i)||^2``, is at most the norm budget
``B_norm`` (the noise is ``s = sqrt(B_norm / (2 kappa))``, Feldman & Zrnic Corollary 4.7). We set
``B_norm`` to the 99.9% quantile of ``||C x||^2`` under the *public* model of the data (i.i.d.
Bernoulli(rate) days), estimated by Monte Carlo on ``--plan-users`` simulated users drawn with a
seed independent of the benchmark's stream. The private stream itself is never used to choose a
parameter (that would leak), and the fraction of its users never filtered is reported: it
should be about 99.9%.

Noise draws. Under a fixed (non-adaptive) strategy the filter's decisions do not depend on the
noise, so each strategy's admitted sums ``C x`` are computed once and ``--draws`` independent
noise vectors are added to them (vectorised, a seeded NumPy generator; the pipeline's keyed noise
is tested separately in ``tests/test_continual.py``). RMSE at day ``t`` is over the draws;
its relative standard error is about ``1 / sqrt(2 draws)``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from stream.accounting import calibrate
from stream.continual import BinaryTree, RunningState, SquareRootFactorization, Strategy, WindowSums
from stream.ledger import ADMITTED, Ledger

REPORT_DAYS = (30, 90, 180, 365)
QUANTILE = 0.999


@dataclass
class Case:
    label: str
    strategy: Strategy
    worst_case: bool


CASES = (
    Case("(a) window sums, individual", WindowSums(), False),
    Case("(b) sqrt factorisation, individual", SquareRootFactorization(), False),
    Case("(c) tree + least squares, individual", BinaryTree(), False),
    Case("(a') window sums, worst case", WindowSums(), True),
    Case("(b') sqrt factorisation, worst case", SquareRootFactorization(), True),
)


def total_sq_norms(strategy: Strategy, activity: np.ndarray, *, chunk: int = 20_000) -> np.ndarray:
    """``||C x_i||^2`` over the whole horizon for each row of a 0/1 ``(users, T)`` matrix."""
    horizon = activity.shape[1]
    c_t = sp.csr_matrix(strategy.query_matrix(horizon).T)  # (T, rows)
    out = np.empty(activity.shape[0])
    for start in range(0, activity.shape[0], chunk):
        block = sp.csr_matrix(activity[start:start + chunk].astype(np.float64))
        q = (block @ c_t).toarray()
        out[start:start + chunk] = np.einsum("ij,ij->i", q, q)
    return out


def plan_sq_norms(strategy: Strategy, *, users: int, days: int, rate: float, seed: int) -> np.ndarray:
    """``||C x||^2`` of ``users`` users simulated from the public Bernoulli(rate) model."""
    rng = np.random.default_rng(seed)
    return total_sq_norms(strategy, rng.random((users, days)) < rate)


def run_filter(strategy: Strategy, activity: np.ndarray, *, rho: float, noise_std: float,
               policy: str) -> tuple[list[np.ndarray], np.ndarray, float]:
    """Day by day through RunningState + Ledger: admitted sums per day, ever-filtered flags, seconds."""
    users, days = activity.shape
    state = RunningState(strategy=strategy, dim=1, start_window=0)
    ledger = Ledger(budget=rho)
    filtered = np.zeros(users, dtype=bool)
    totals = []
    started = time.perf_counter()
    for t in range(days):
        ids = np.flatnonzero(activity[:, t]).astype(np.int64)
        step = state.step(ids, np.ones((ids.size, 1)), window_id=t, ledger=ledger,
                          noise_std=noise_std, policy=policy)
        filtered[step.user_ids[step.status != ADMITTED]] = True
        totals.append(step.total)
    seconds = time.perf_counter() - started
    assert float(ledger.used(np.arange(users)).max()) <= rho
    return totals, filtered, seconds


def draw_estimates(strategy: Strategy, totals: list[np.ndarray], *, noise_std: float, draws: int,
                   rng: np.random.Generator) -> np.ndarray:
    """``(T, draws)`` running-total estimates from ``draws`` independent noisy release streams."""
    releases = [y[:, :, None] + noise_std * rng.standard_normal((*y.shape, draws)) for y in totals]
    return strategy.post_process(releases)[:, 0, :]


def _evaluate(case: Case, norm_budget: float, activity: np.ndarray, truth: np.ndarray, args: argparse.Namespace,
              rng: np.random.Generator, report_days: list[int]) -> dict:
    strategy, days = case.strategy, activity.shape[1]
    cal = calibrate(epsilon=args.epsilon, delta=args.delta, norm_budget=norm_budget)
    totals, filtered, seconds = run_filter(strategy, activity, rho=cal.rho, noise_std=cal.noise_std,
                                           policy=args.policy)
    estimates = draw_estimates(strategy, totals, noise_std=cal.noise_std, draws=args.draws, rng=rng)
    errors = estimates - truth[:, None]
    rmse = np.sqrt(np.mean(errors**2, axis=1))
    spread = np.std(estimates, axis=1, ddof=1)  # noise only: the filter's bias removed
    declared = strategy.estimate_std(days, noise_std=cal.noise_std)
    bias = strategy.post_process(totals)[:, 0] - truth
    mu2 = 2.0 * cal.rho
    return {
        "case": case.label, "norm_budget": norm_budget, "noise_std": cal.noise_std,
        "never_filtered": float(1.0 - filtered.mean()), "filtered_users": int(filtered.sum()),
        "rmse": {d: float(rmse[d - 1]) for d in report_days},
        "rmse_all_days": float(np.sqrt(np.mean(rmse**2))),
        "rmse_every_day": [float(v) for v in rmse],
        "noise_sd": {d: float(spread[d - 1]) for d in report_days},
        "declared_std": {d: float(declared[d - 1]) for d in report_days},
        "bias": {d: float(bias[d - 1]) for d in report_days},
        "declared_var_x_mu2": float(norm_budget * strategy.estimate_variance(days)[-1]),
        "measured_noise_var_x_mu2": float(spread[-1] ** 2 * mu2),
        "measured_mse_x_mu2": float(rmse[-1] ** 2 * mu2),
        "filter_seconds": seconds,
        "_series": (estimates[:, 0], rmse, declared, bias),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--draws", type=int, default=1000, help="noise draws per strategy (>= 20)")
    parser.add_argument("--plan-users", type=int, default=200_000, help="Monte Carlo users for the norm budget")
    parser.add_argument("--quantile", type=float, default=QUANTILE,
                        help="fraction of the public model's users never filtered (default 0.999)")
    parser.add_argument("--sensitivity-quantile", type=float, default=0.9999,
                        help="a second budget quantile, reported for (a)-(c) to show the bias/noise trade-off")
    parser.add_argument("--policy", choices=("drop", "clip"), default="drop")
    parser.add_argument("--seed", type=int, default=20240909)
    parser.add_argument("--chart", type=Path, default=None, help="write a PNG chart here")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.draws < 20:
        parser.error(f"--draws must be >= 20, got {args.draws}")
    for name in ("quantile", "sensitivity_quantile"):
        if not 0.0 < getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(args, name)}")
    days = args.days
    report_days = [d for d in REPORT_DAYS if d < days] + [days]  # always ends at the last day
    end = report_days[-1]

    seeds = np.random.SeedSequence(args.seed).spawn(3)  # stream, plan, noise: independent
    data_rng, noise_rng = np.random.default_rng(seeds[0]), np.random.default_rng(seeds[2])
    plan_seed = int(seeds[1].generate_state(1)[0])
    activity = data_rng.random((args.users, days)) < args.rate
    truth = np.cumsum(activity.sum(axis=0)).astype(np.float64)
    unit = calibrate(epsilon=args.epsilon, delta=args.delta, norm_budget=1.0)
    rho, mu = unit.rho, unit.mu

    print(f"# running totals: {args.users} users x {days} days, rate {args.rate}, "
          f"(eps, delta) = ({args.epsilon}, {args.delta}), accounting {unit.accounting}: "
          f"kappa = {rho:.6f} zCDP, mu = {mu:.6f} GDP; policy {args.policy}; {args.draws} noise draws")
    print(f"# norm budgets: the {args.quantile:.2%} quantile of ||C x||^2 over {args.plan_users:,} users "
          f"simulated from the public model (independent seed)")
    print(f"# machine: {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}")

    started = time.perf_counter()
    results, sensitivity, plans = [], [], {}
    for case in CASES:
        if case.worst_case:
            norm_budget = case.strategy.worst_case_sq_norm(days)
        else:
            plans[case.label] = plan_sq_norms(case.strategy, users=args.plan_users, days=days,
                                              rate=args.rate, seed=plan_seed)
            norm_budget = float(np.quantile(plans[case.label], args.quantile, method="higher"))
        row = _evaluate(case, norm_budget, activity, truth, args, noise_rng, report_days)
        results.append(row)
        print(f"  {case.label}: B_norm = {norm_budget:,.1f}, s = {row['noise_std']:.2f}, "
              f"users filtered {row['filtered_users']}, filter {row['filter_seconds']:.1f}s", flush=True)
    for case in CASES:
        if not case.worst_case:
            norm_budget = float(np.quantile(plans[case.label], args.sensitivity_quantile, method="higher"))
            sensitivity.append(_evaluate(case, norm_budget, activity, truth, args, noise_rng, report_days))
    total_seconds = time.perf_counter() - started

    print()
    head = " | ".join(f"RMSE d{d}" for d in report_days)
    print(f"| case | B_norm | s | {head} | RMSE all days | noise sd d{end} (measured / declared) | bias d{end} "
          f"| var x mu^2 d{end} (declared / measured noise / measured MSE) | users never filtered |")
    print("|---|---:|---:|" + "---:|" * len(report_days) + "---:|---:|---:|---:|---:|")
    for row in results:
        cells = " | ".join(f"{row['rmse'][d]:,.0f}" for d in report_days)
        print(f"| {row['case']} | {row['norm_budget']:,.1f} | {row['noise_std']:.1f} | {cells} | "
              f"{row['rmse_all_days']:,.0f} | {row['noise_sd'][end]:,.0f} / {row['declared_std'][end]:,.0f} | "
              f"{row['bias'][end]:+,.0f} | "
              f"{row['declared_var_x_mu2']:,.0f} / {row['measured_noise_var_x_mu2']:,.0f} / "
              f"{row['measured_mse_x_mu2']:,.0f} | {100 * row['never_filtered']:.2f}% |")
    by = {r["case"].split()[0]: r for r in results}
    a_prime = "(a')"

    def ratio(a: str, b: str, key: str = "rmse") -> float:
        return by[a][key][end] / by[b][key][end]

    print()
    print(f"RMSE ratios at day {end} (measured, bias included):  (a)/(b) = {ratio('(a)', '(b)'):.2f} "
          f"(target >= 2),  (a')/(b) = {ratio(a_prime, '(b)'):.2f} (target >= 7),  "
          f"(c)/(b) = {ratio('(c)', '(b)'):.2f},  (a)/(c) = {ratio('(a)', '(c)'):.2f}")
    print(f"noise-only ratios at day {end} (declared std):    (a)/(b) = {ratio('(a)', '(b)', 'declared_std'):.2f},"
          f"  (a')/(b) = {ratio(a_prime, '(b)', 'declared_std'):.2f},  (c)/(b) = "
          f"{ratio('(c)', '(b)', 'declared_std'):.2f}")
    print()
    print(f"budget at the {args.sensitivity_quantile:.2%} quantile instead (same stream, same code):")
    print(f"| case | B_norm | RMSE d{end} | noise sd d{end} | bias d{end} | users never filtered "
          f"| RMSE ratio (a')/this |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in sensitivity:
        print(f"| {row['case']} | {row['norm_budget']:,.1f} | {row['rmse'][end]:,.0f} | "
              f"{row['declared_std'][end]:,.0f} | {row['bias'][end]:+,.0f} | {100 * row['never_filtered']:.2f}% | "
              f"{by[a_prime]['rmse'][end] / row['rmse'][end]:.2f} |")
    print()
    print(f"||C 1||^2 at T={days}: window sums {WindowSums().worst_case_sq_norm(days):,.0f}, "
          f"sqrt {SquareRootFactorization().worst_case_sq_norm(days):,.0f} "
          f"(2 T^2 / pi = {2 * days**2 / math.pi:,.0f}), tree {BinaryTree().worst_case_sq_norm(days):,.0f}")
    print(f"||B_T||^2 at T={days} (units of s^2): window sums {days}, "
          f"sqrt {SquareRootFactorization().estimate_variance(days)[-1]:.3f}, "
          f"tree {BinaryTree().estimate_variance(days)[-1]:.3f}")
    print(f"total {total_seconds:.1f}s")

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results + sensitivity]
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rho": rho, "mu": mu, "results": clean}, indent=2))
    if args.chart is not None:
        _chart(args.chart, truth, results)
        print(f"chart written to {args.chart}")
    return 0


def _chart(path: Path, truth: np.ndarray, results: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = np.arange(1, truth.size + 1)
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 * len(results)), sharex=True, sharey=True)
    limit = 1.15 * max(1.96 * float(r["_series"][2].max()) for r in results if "worst" not in r["case"])
    for ax, row in zip(axes, results):
        released, rmse, declared, bias = row["_series"]
        ax.fill_between(days, -1.96 * declared, 1.96 * declared, color="tab:blue", alpha=0.18,
                        label="95% band (declared std)")
        ax.plot(days, released - truth, color="tab:blue", lw=0.8, label="released - truth (one draw)")
        ax.plot(days, rmse, color="tab:red", lw=1.0, ls="--", label="RMSE over draws")
        ax.plot(days, bias, color="tab:green", lw=1.2, label="filter bias (noise-free)")
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set_title(row["case"], fontsize=9, loc="left")
        ax.set_ylim(-limit, limit)
    axes[0].legend(fontsize=7, loc="upper left", ncol=2)
    axes[-1].set_xlabel("day")
    fig.suptitle(f"Running total (truth reaches {truth[-1]:,.0f}): release error and its band", fontsize=10)
    fig.supylabel("count")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
