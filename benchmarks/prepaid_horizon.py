"""The declared horizon of a prepaid running query: a declared 365-window schedule against the
infinite tail, for the shipped 365-day 4-buffer BLT (issue 20; docs/running_totals.md, "The
declared horizon").

    python benchmarks/prepaid_horizon.py            # 20k users x 365 days, 400 draws, both rates

For each activity rate (Bernoulli(0.05) and Bernoulli(0.5) days, one binary indicator) and each
horizon (declared 365, infinite tail): the 99.9% budget rule on model users drawn with an
independent seed (the quantile of each model user's total prepaid charge,
``bench_continual.prepaid_totals``), the noise for ``(epsilon, delta) = (1, 1e-5)`` (GDP), then
the real prepaid code day by day on the stream (``bench_continual.run_prepaid``, policy ``drop``)
and ``--draws`` noise draws: the day-365 RMSE, the max RMSE over days and the max declared std.
One JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_continual import draw_estimates, plan_activity, prepaid_totals, run_prepaid  # noqa: E402
from renyi_stream.stream.accounting import calibrate  # noqa: E402
from renyi_stream.stream.continual.blt import BufferedLinearToeplitz  # noqa: E402
from renyi_stream.stream.continual.prepaid import BLTPrepaid  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--draws", type=int, default=400)
    args = parser.parse_args(argv)
    blt = BufferedLinearToeplitz.shipped(365, 4)
    for rate in (0.05, 0.5):
        model = plan_activity(users=args.users, days=args.days, rate=rate, seed=11)
        stream = plan_activity(users=args.users, days=args.days, rate=rate, seed=12)
        truth = np.cumsum(stream.sum(axis=0))
        for horizon in (args.days, None):
            rule = BLTPrepaid(blt, horizon=horizon)
            budget = float(np.quantile(prepaid_totals(rule, model), 0.999, method="higher"))
            cal = calibrate(epsilon=1.0, delta=1e-5, norm_budget=budget)
            totals, filtered, _, _ = run_prepaid(rule, stream, rho=cal.rho, noise_std=cal.noise_std, policy="drop")
            estimates = draw_estimates(blt, totals, noise_std=cal.noise_std, draws=args.draws,
                                       rng=np.random.default_rng(5))
            rmse = np.sqrt(np.mean((estimates - truth[:, None]) ** 2, axis=1))
            declared = blt.estimate_std(args.days, noise_std=cal.noise_std)
            print(json.dumps({"rate": rate, "horizon": horizon or "tail", "norm_budget": budget,
                              "noise_std": cal.noise_std, "rmse_last_day": float(rmse[-1]),
                              "max_rmse": float(rmse.max()), "max_declared_std": float(declared.max()),
                              "never_filtered": float(1 - filtered.mean())}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
