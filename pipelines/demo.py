"""A curator-side simulation: daily indicator batches -> individual filter -> noisy daily sums.

This is the main job until the Beam pipeline lands (issue 3 replaces it with ``renyi-stream
run``). It exercises the privacy core end to end on generated data: real Arrow batches written
to and read from real Parquet files, the schema validator with its dead-letter rows, the
ledger, keyed noise from a key file, and a comparison with worst-case accounting.

It prints true-vs-released errors, which only the curator may see (DESIGN.md invariant 4): the
point of a simulation is to measure them. Public outputs (``releases.parquet``) hold only
released values; the curator's files (``curator/``) hold the ledger and the diagnostics.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stream.accounting import ACCOUNTINGS, Calibration, calibrate
from stream.ledger import Ledger, Policy
from stream.noise import NoiseKey, gaussian_noise
from stream.schema import WindowSpec, validate_batch

INDICATORS = ("opened_app", "changed_plan", "filed_complaint")
QUERY_ID = "daily_sum"
START_DAY = dt.date(2026, 1, 1)
_EPOCH = dt.date(1970, 1, 1)
# Bad rows injected into the stream so the dead-letter path runs: (every n-th day, kind).
_BAD_ROW_KINDS = ("null_user_id", "non_finite_value", "duplicate_user_window")


@dataclass(frozen=True)
class DemoConfig:
    """Parameters of the simulation; validated on construction."""

    users: int = 20_000
    days: int = 60
    epsilon: float = 1.0
    delta: float = 1e-6
    norm_budget: float = 40.0
    policy: str = "clip"
    accounting: str = "gdp"
    out_dir: str | Path = "renyi-demo"
    seed: int = 7

    def __post_init__(self) -> None:
        if not 1 <= self.users <= 10_000_000:
            raise ValueError(f"users must be in [1, 10000000], got users={self.users}")
        if not 1 <= self.days <= 3660:
            raise ValueError(f"days must be in [1, 3660], got days={self.days}")
        if self.accounting not in ACCOUNTINGS:
            raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got accounting={self.accounting!r}")
        Policy(self.policy)
        # Range checks of epsilon, delta and norm_budget, with their messages:
        calibrate(epsilon=self.epsilon, delta=self.delta, norm_budget=self.norm_budget,
                  accounting=self.accounting)


@dataclass
class DemoSummary:
    """What the simulation measured (curator-only numbers)."""

    calibration: Calibration
    rows_read: int = 0
    admitted: int = 0
    clipped: int = 0
    dropped: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    rmse_individual: float = 0.0
    rmse_worst_case_all_days: float = 0.0
    worst_case_days_at_same_noise: int = 0
    users_ever_filtered: int = 0
    days_with_every_user_in: int = 0
    seconds: float = 0.0

    @property
    def totals_balance(self) -> bool:
        return self.rows_read == self.admitted + self.clipped + self.dropped + self.rejected


def _day_batch(rng: np.random.Generator, day: dt.date, activity: np.ndarray, day_index: int) -> pa.RecordBatch:
    """One day's rows: users with any activity that day, plus a few deliberately bad rows."""
    users = activity.size
    opened = rng.random(users) < activity
    plan = rng.random(users) < 0.004
    complaint = rng.random(users) < 0.02 * activity
    active = np.flatnonzero(opened | plan | complaint)
    ids = active.astype(np.int64)
    columns = {
        "user_id": pa.array(ids, type=pa.int64()),
        "day": pa.array([day] * ids.size, type=pa.date32()),
        "opened_app": pa.array(opened[active].astype(np.float64)),
        "changed_plan": pa.array(plan[active].astype(np.float64)),
        "filed_complaint": pa.array(complaint[active].astype(np.float64)),
    }
    batch = pa.table(columns)
    kind = _BAD_ROW_KINDS[day_index % len(_BAD_ROW_KINDS)]
    if day_index % 5 == 0 and ids.size:
        bad = {
            "user_id": pa.array([None if kind == "null_user_id" else int(ids[0])], type=pa.int64()),
            "day": pa.array([day], type=pa.date32()),
            "opened_app": pa.array([math.nan if kind == "non_finite_value" else 1.0]),
            "changed_plan": pa.array([0.0]),
            "filed_complaint": pa.array([0.0]),
        }
        batch = pa.concat_tables([batch, pa.table(bad)])
    return batch.combine_chunks().to_batches()[0]


def _write_inputs(config: DemoConfig, input_dir: Path) -> list[Path]:
    rng = np.random.default_rng(config.seed)
    # Heterogeneous users: most are occasional, a few use the app nearly every day.
    activity = rng.beta(0.4, 3.0, size=config.users)
    input_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(config.days):
        day = START_DAY + dt.timedelta(days=i)
        path = input_dir / f"day={day.isoformat()}.parquet"
        pq.write_table(pa.Table.from_batches([_day_batch(rng, day, activity, i)]), path)
        paths.append(path)
    return paths


def run_demo(config: DemoConfig, progress: TextIO | None = None) -> DemoSummary:
    """Run the simulation, write its files under ``config.out_dir`` and print a summary."""
    started = time.perf_counter()
    out = Path(config.out_dir)
    curator = out / "curator"
    curator.mkdir(parents=True, exist_ok=True)
    paths = _write_inputs(config, out / "input")
    key = NoiseKey.load_or_create(curator / "noise.key")
    cal = calibrate(epsilon=config.epsilon, delta=config.delta, norm_budget=config.norm_budget,
                    accounting=config.accounting)
    ledger = Ledger(budget=cal.rho)
    summary = DemoSummary(calibration=cal)
    dim = len(INDICATORS)
    worst_case_sq_norm = float(dim)  # binary indicators: ||q||^2 <= d
    # Worst-case accounting answering every day must charge everyone d per day.
    worst_std = math.sqrt(config.days * worst_case_sq_norm / (2 * cal.rho))
    summary.worst_case_days_at_same_noise = int(config.norm_budget // worst_case_sq_norm)
    start_window = (START_DAY - _EPOCH).days
    spec = WindowSpec()
    releases, diagnostics = [], []
    errors_individual, errors_worst = [], []
    filtered_users: set[int] = set()
    interactive = progress is not None and getattr(progress, "isatty", lambda: False)()
    for i, path in enumerate(paths):
        window = start_window + i
        batch = pq.read_table(path)
        summary.rows_read += batch.num_rows
        checked = validate_batch(batch, window=spec, start_window=start_window,
                                 end_window=start_window + config.days - 1)
        summary.rejected += checked.rejected.num_rows
        for reason in checked.rejected.column("reason").to_pylist():
            summary.rejected_by_reason[reason] = summary.rejected_by_reason.get(reason, 0) + 1
        valid = checked.valid
        values = np.column_stack([valid.column(c).to_numpy() for c in INDICATORS]) if valid.num_rows else np.zeros((0, dim))
        result = ledger.admit(valid.column("user_id"), values, noise_std=cal.noise_std, policy=config.policy)
        counts = result.counts()
        summary.admitted += counts["admitted"]
        summary.clipped += counts["clipped"]
        summary.dropped += counts["dropped"]
        ids = valid.column("user_id").to_numpy()
        filtered_users.update(ids[result.status != 0].tolist())
        if not filtered_users:
            summary.days_with_every_user_in = i + 1
        true_sum = values.sum(axis=0)
        released = result.contributions.sum(axis=0) + gaussian_noise(
            key, query_id=QUERY_ID, window_id=window, dim=dim, noise_std=cal.noise_std)
        worst = true_sum + gaussian_noise(key, query_id="worst_case_baseline", window_id=window,
                                          dim=dim, noise_std=worst_std)
        errors_individual.append(released - true_sum)
        errors_worst.append(worst - true_sum)
        day = START_DAY + dt.timedelta(days=i)
        for j, label in enumerate(INDICATORS):
            releases.append({"window_start": day, "query_id": QUERY_ID, "label": label,
                             "value": float(released[j]), "noise_std": cal.noise_std,
                             "accounting": cal.accounting})
            diagnostics.append({"window_start": day, "label": label, "true_sum": float(true_sum[j]),
                                **counts})
        if progress is not None:
            line = (f"[demo] day {i + 1}/{config.days} ({day.isoformat()}): {valid.num_rows:,} rows, "
                    f"{counts['clipped'] + counts['dropped']:,} filtered")
            if interactive:
                progress.write("\r" + line)
            elif (i + 1) % max(1, config.days // 10) == 0 or i + 1 == config.days:
                progress.write(line + "\n")  # a log file gets a line every tenth of the run
            progress.flush()
    if progress is not None and interactive:
        progress.write("\n")
    pq.write_table(pa.Table.from_pylist(releases), out / "releases.parquet")
    pq.write_table(pa.Table.from_pylist(diagnostics), curator / "diagnostics.parquet")
    pq.write_table(ledger.to_arrow(), curator / "ledger.parquet")
    summary.rmse_individual = float(np.sqrt(np.mean(np.square(errors_individual))))
    summary.rmse_worst_case_all_days = float(np.sqrt(np.mean(np.square(errors_worst))))
    summary.users_ever_filtered = len(filtered_users)
    summary.seconds = time.perf_counter() - started
    _print_summary(config, summary, worst_std)
    return summary


def _print_summary(config: DemoConfig, s: DemoSummary, worst_std: float) -> None:
    cal = s.calibration
    out = Path(config.out_dir)
    print(f"renyi-stream demo: {config.users:,} users x {config.days} days, indicators {', '.join(INDICATORS)}")
    print(f"promise: ({cal.epsilon:g}, {cal.delta:g})-DP per user; accounting {cal.accounting} "
          f"(zCDP budget {cal.rho:.4g}, mu {cal.mu:.4g}); squared-norm budget B = {cal.norm_budget:g}")
    print(f"noise std per released coordinate: {cal.noise_std:.3f}")
    print()
    print(f"rows read {s.rows_read:,} = admitted {s.admitted:,} + clipped {s.clipped:,} + dropped "
          f"{s.dropped:,} + rejected {s.rejected:,}  [{'balanced' if s.totals_balance else 'MISMATCH'}]")
    if s.rejected_by_reason:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(s.rejected_by_reason.items()))
        print(f"dead-letter rows by reason: {reasons}")
    print(f"users filtered at least once: {s.users_ever_filtered:,} of {config.users:,}; "
          f"every user was still in for the first {s.days_with_every_user_in} of {config.days} days")
    print()
    print("Daily sums, error of the released value against the true sum (curator-only diagnostic):")
    print(f"  individual accounting, all {config.days} days answered: RMSE {s.rmse_individual:.2f} "
          f"(noise {cal.noise_std:.2f} plus filtering bias)")
    print(f"  worst-case accounting, same promise, all {config.days} days: RMSE "
          f"{s.rmse_worst_case_all_days:.2f} (noise std {worst_std:.2f}, "
          f"{(worst_std / cal.noise_std) ** 2:.1f}x the variance)")
    print(f"  worst-case accounting at the individual noise level: answers only "
          f"{s.worst_case_days_at_same_noise} days (B / C^2 with C^2 = {len(INDICATORS)}), "
          f"against {s.days_with_every_user_in} with every user in here")
    print()
    print(f"public releases: {out / 'releases.parquet'}")
    print(f"curator files:   {out / 'curator'} (ledger.parquet, diagnostics.parquet, noise.key)")
    print(f"done in {s.seconds:.1f} s")
