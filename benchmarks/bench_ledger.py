"""Benchmark: ``Ledger.admit`` throughput against a plain NumPy reference (the floor).

One command::

    python benchmarks/bench_ledger.py            # 1M users, d in {1, 8}, drop and clip
    python benchmarks/bench_ledger.py --users 100000 --repeats 3   # quicker

For each case the ledger first sees all users once (inserting them), then the timed calls
admit one row per user in a random order, as a window of a daily job would. Two anchors run in
the same process on the same rows:

* ``same arithmetic`` (the named anchor of issue 2): the ledger's own kernels (rounded-up
  charges, the filter decision, the personal tracker, the scaling of rows) on state arrays
  already aligned with the rows: everything ``admit`` does except finding each user's state
  by id (hash lookup, repeat check, gather and scatter). The floor we cannot beat.
* ``bare``: the textbook filter arithmetic with no rounding guards and no tracker, a lower
  floor still, reported so the cost of the guards is visible too.

Reported: user-rows per second and the ratios (anchor time / ledger time); targets from
issue 2: ratio >= 0.3 against the named anchor and >= 5M user-rows/s for d = 1.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

from renyi_stream.stream.accounting.gaussian import gaussian_charge
from renyi_stream.stream.accounting.odometers import tracker_update
from renyi_stream.stream.ledger import Ledger, individual_filter

BUDGET = 1.0
NOISE_STD = 4.0


def same_arithmetic(state: dict, x: np.ndarray, *, policy: str, step: float, cap: float) -> np.ndarray:
    """Everything ``Ledger.admit`` computes, on state arrays aligned with the rows (no id lookup)."""
    charge = gaussian_charge(contributions=x, noise_std=NOISE_STD)
    decision = individual_filter(state["used"], charge, cap=cap, policy=policy)
    state["used"] = decision.new_used
    charged = decision.charge > 0
    segment, bound = tracker_update(
        state["segment"][charged], state["bound"][charged], decision.charge[charged], step=step
    )
    state["segment"][charged] = segment
    state["bound"][charged] = bound
    return x * decision.scale[:, None]


def bare_filter(used: np.ndarray, x: np.ndarray, *, policy: str) -> np.ndarray:
    """The textbook filter arithmetic on pre-aligned arrays: no guards, no tracker."""
    charge = np.einsum("ij,ij->i", x, x) / (2.0 * NOISE_STD * NOISE_STD)
    total = used + charge
    fits = total <= BUDGET
    if policy == "drop":
        used[:] = np.where(fits, total, used)
        return x * fits[:, None]
    remaining = np.maximum(BUDGET - used, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(fits, 1.0, np.sqrt(remaining / charge))
    used[:] = np.where(fits, total, used + np.where(scale > 0, remaining, 0.0))
    return x * scale[:, None]


def _best_of(repeats: int, run) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def bench_case(users: int, dim: int, policy: str, repeats: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.choice(2**62, size=users, replace=False).astype(np.int64)
    # Sparse indicator-like rows: most users contribute little each window.
    rows = rng.exponential(0.05, size=(users, dim)) * (rng.random((users, 1)) < 0.3)
    ledger = Ledger(budget=BUDGET)
    start = time.perf_counter()
    ledger.admit(ids, rows, noise_std=NOISE_STD, policy=policy)
    first_call = time.perf_counter() - start
    order = rng.permutation(users)
    shuffled_ids, shuffled_rows = ids[order], rows[order]
    ledger_s = _best_of(repeats, lambda: ledger.admit(shuffled_ids, shuffled_rows, noise_std=NOISE_STD, policy=policy))
    state = {"used": np.zeros(users), "segment": np.zeros(users), "bound": np.full(users, ledger.tracker_step)}
    same_s = _best_of(repeats, lambda: same_arithmetic(
        state, shuffled_rows, policy=policy, step=ledger.tracker_step, cap=ledger._cap))
    used = np.zeros(users)
    bare_s = _best_of(repeats, lambda: bare_filter(used, shuffled_rows, policy=policy))
    return {
        "users": users,
        "dim": dim,
        "policy": policy,
        "first_call_s": round(first_call, 4),
        "ledger_s": round(ledger_s, 4),
        "same_arithmetic_s": round(same_s, 4),
        "bare_s": round(bare_s, 4),
        "ledger_rows_per_s": round(users / ledger_s),
        "same_arithmetic_rows_per_s": round(users / same_s),
        "bare_rows_per_s": round(users / bare_s),
        "ratio_vs_same_arithmetic": round(same_s / ledger_s, 3),
        "ratio_vs_bare": round(bare_s / ledger_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object per case")
    args = parser.parse_args(argv)
    print(f"# machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}, numpy {np.__version__}")
    print(f"# {args.users:,} users, one row each per call, random order; best of {args.repeats}")
    print(f"{'d':>3} {'policy':>6} {'first call':>11} {'ledger rows/s':>14} {'anchor rows/s':>14} "
          f"{'ratio':>6} {'bare rows/s':>13} {'ratio':>6}")
    for dim in (1, 8):
        for policy in ("drop", "clip"):
            result = bench_case(args.users, dim, policy, args.repeats)
            if args.json:
                print(json.dumps(result))
            else:
                print(
                    f"{dim:>3} {policy:>6} {result['first_call_s']:>10.3f}s {result['ledger_rows_per_s']:>14,} "
                    f"{result['same_arithmetic_rows_per_s']:>14,} {result['ratio_vs_same_arithmetic']:>6.3f} "
                    f"{result['bare_rows_per_s']:>13,} {result['ratio_vs_bare']:>6.3f}"
                )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
