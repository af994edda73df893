"""The demo: a realistic synthetic stream, run day by day through the Beam daily job.

``renyi-stream demo`` generates N users x T days of sparse, heterogeneous indicators (most
users occasional, a few heavy, a few malformed rows), writes one Parquet file per day, runs
``renyi-stream run`` on each day in turn (DirectRunner, DuckDB files under ``--out``), and then
shows what individual accounting bought against worst-case accounting at the same
``(epsilon, delta)``: how many days were answered with every user still in, the error of the
releases against the synthetic truth, and a PNG chart of the released series with their 95%
bands and of the share of users filtered over time.

The truth is known here only because the data is synthetic: comparing releases with it is a
curator-side diagnostic, and nothing of it is written to the public release store.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.stream.contract import DeclaredColumn, InputContract
from renyi_stream.stream.accounting import ACCOUNTINGS, calibrate
from renyi_stream.stream.ledger import Policy
from renyi_stream.pipelines.curator.store import connect_curator
from renyi_stream.stream.private_files import private_dir, private_umask

INDICATORS = ("opened_app", "changed_plan", "filed_complaint")
#: The demo's declared input: integer ids and three 0/1 indicators, each sum clamped to [0, 1].
CONTRACT = InputContract("int64", tuple(DeclaredColumn(name, "number", 0.0, 1.0) for name in INDICATORS))
START_DAY = dt.date(2026, 1, 1)
_EPOCH = dt.date(1970, 1, 1)


@dataclass(frozen=True)
class DemoConfig:
    """Parameters of the demo; validated on construction."""

    users: int = 100_000
    days: int = 90
    epsilon: float = 1.0
    delta: float = 1e-6
    norm_budget: float | None = None  # default: one unit per day, see ``budget``
    policy: str = "drop"
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
        calibrate(epsilon=self.epsilon, delta=self.delta, norm_budget=self.budget, accounting=self.accounting)

    @property
    def budget(self) -> float:
        """B: by default one unit of squared norm per day, so a user who shows one indicator
        every day stays in throughout, while worst-case accounting must assume all three."""
        return float(self.days) if self.norm_budget is None else self.norm_budget


@dataclass
class DemoSummary:
    """What the demo measured (curator-only numbers)."""

    rows_read: int = 0
    admitted: int = 0
    clipped: int = 0
    dropped: int = 0
    rejected: int = 0
    late: int = 0
    days_with_every_user_in: int = 0
    worst_case_days_at_same_noise: int = 0
    rmse_individual: float = 0.0
    rmse_worst_case_all_days: float = 0.0
    noise_std: float = 0.0
    worst_case_noise_std: float = 0.0
    seconds: float = 0.0

    @property
    def balanced(self) -> bool:
        return self.rows_read == self.admitted + self.clipped + self.dropped + self.rejected + self.late


def _generate(config: DemoConfig, folder: Path) -> tuple[list[str], np.ndarray]:
    """One Parquet file per day; returns the paths and the true daily sums (days x indicators)."""
    rng = np.random.default_rng(config.seed)
    activity = rng.beta(0.35, 3.0, size=config.users)  # mostly occasional users
    heavy = rng.random(config.users) < 0.02  # and a few who are there nearly every day
    activity[heavy] = rng.uniform(0.8, 1.0, size=int(heavy.sum()))
    complaint_rate = 0.03 * activity
    folder.mkdir(parents=True, exist_ok=True)
    paths, truth = [], np.zeros((config.days, len(INDICATORS)))
    for d in range(config.days):
        day = START_DAY + dt.timedelta(days=d)
        opened = rng.random(config.users) < activity
        plan = rng.random(config.users) < 0.003
        complaint = rng.random(config.users) < complaint_rate
        rows = np.flatnonzero(opened | plan | complaint)
        values = np.column_stack([opened[rows], plan[rows], complaint[rows]]).astype(np.float64)
        truth[d] = values.sum(axis=0)
        table = pa.table({
            "user_id": pa.array(rows.astype(np.int64)),
            "day": pa.array([day] * rows.size, type=pa.date32()),
            **{name: pa.array(values[:, j]) for j, name in enumerate(INDICATORS)},
        })
        if d % 7 == 3 and rows.size:  # a few malformed rows, as real feeds have
            bad = pa.table({
                "user_id": pa.array([None, int(rows[0]), int(rows[-1])], type=pa.int64()),
                "day": pa.array([day, day, START_DAY], type=pa.date32()),  # the last one is late
                "opened_app": pa.array([1.0, math.nan, 1.0]),
                "changed_plan": pa.array([0.0, 0.0, 0.0]),
                "filed_complaint": pa.array([0.0, 0.0, 0.0]),
            })
            table = pa.concat_tables([table, bad])
        path = folder / f"day={day.isoformat()}.parquet"
        pq.write_table(table, path)
        paths.append(str(path))
    return paths, truth


#: The file that marks a folder as a demo's own, which the next demo may replace.
DEMO_MARKER = ".renyi-demo"


def check_demo_folder(out: Path) -> bool:
    """Whether ``out`` holds a previous demo (which this one replaces: True) or nothing (False).
    ValueError naming ``--out`` when it holds anything else: a demo replaces its own folder only,
    marked by :data:`DEMO_MARKER`, never files it did not write (a deployment's folder may look
    like a demo's: ``input/``, ``curator/``, ``releases.duckdb``)."""
    if not out.exists() or not any(out.iterdir()):
        return False
    if (out / DEMO_MARKER).is_file():
        return True
    raise ValueError(f"--out {out} holds files that are not a demo's (no {DEMO_MARKER}): give an empty or new "
                     "folder (a demo replaces only a folder a demo marked; remove an older demo's folder yourself)")


def run_demo(config: DemoConfig, progress: TextIO | None = None) -> DemoSummary:
    """Generate, run every day through the daily job, compare, chart; print a summary."""
    started = time.perf_counter()
    out = Path(config.out_dir)
    replacing = check_demo_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("a renyi-stream demo's folder: the next demo replaces what is here\n")
    if progress and replacing:
        progress.write(f"[demo] replacing the previous demo in {out}\n")
    private_dir(out / "curator")  # the ledger and key: 0700 even when an older demo left it open
    for stale in ("releases.duckdb", "curator/ledger.duckdb"):  # a demo always starts afresh
        for suffix in ("", ".wal"):
            (out / (stale + suffix)).unlink(missing_ok=True)
    if progress:
        progress.write(f"[demo] generating {config.users:,} users x {config.days} days ...\n")
    paths, truth = _generate(config, out / "input")
    cal = calibrate(epsilon=config.epsilon, delta=config.delta, norm_budget=config.budget,
                    accounting=config.accounting)
    summary = DemoSummary(noise_std=cal.noise_std)
    first_window = (START_DAY - _EPOCH).days
    for d, path in enumerate(paths):
        job = run_job(JobConfig(
            inputs=(path,), store=str(out / "releases.duckdb"), ledger=str(out / "curator" / "ledger.duckdb"),
            epsilon=config.epsilon, delta=config.delta, norm_budget=config.budget,
            start_window=first_window + d, end_window=first_window + d, policy=config.policy,
            accounting=config.accounting, key_path=str(out / "curator" / "ledger.noise.key"),
            contract=CONTRACT,
        ))
        for name in ("rows_read", "admitted", "clipped", "dropped", "rejected", "late"):
            setattr(summary, name, getattr(summary, name) + getattr(job, name))
        if job.clipped + job.dropped == 0 and summary.days_with_every_user_in == d:
            summary.days_with_every_user_in = d + 1
        if progress:
            progress.write(f"[demo] day {d + 1}/{config.days}: {job.rows_read:,} rows, "
                           f"{job.clipped + job.dropped:,} filtered, {job.seconds:.1f} s\n")
            progress.flush()
    released = _released(out / "releases.duckdb", config.days)
    worst_sq_norm = float(len(INDICATORS))  # binary indicators: ||q||^2 <= d on any day
    summary.worst_case_days_at_same_noise = min(config.days, int(config.budget // worst_sq_norm))
    summary.worst_case_noise_std = math.sqrt(config.days * worst_sq_norm / (2 * cal.rho))
    summary.rmse_individual = float(np.sqrt(np.mean((released - truth) ** 2)))
    # Worst-case accounting answering every day: unbiased, with noise sqrt(T d / (2 rho)).
    summary.rmse_worst_case_all_days = summary.worst_case_noise_std
    filtered_share = _filtered_share(out / "curator" / "ledger.duckdb", config.days)
    chart = _chart(out / "demo.png", released, truth, cal.noise_std, summary.worst_case_noise_std, filtered_share,
                   summary)
    summary.seconds = time.perf_counter() - started
    _print_summary(config, summary, cal, out, chart)
    return summary


def _released(store: Path, days: int) -> np.ndarray:
    db = duckdb.connect(str(store), read_only=True)
    try:
        rows = db.execute("SELECT window_id, query_id, value FROM releases ORDER BY window_id").fetchall()
    finally:
        db.close()
    first = min(w for w, _, _ in rows)
    out = np.zeros((days, len(INDICATORS)))
    for window, query_id, value in rows:
        out[window - first, INDICATORS.index(query_id.removeprefix("sum:"))] = value
    return out


def _filtered_share(ledger: Path, days: int) -> np.ndarray:
    with private_umask(), connect_curator(ledger, read_only=True) as db:  # spills: 0600 in <ledger>.tmp/
        rows = db.execute("""SELECT window_id, sum(clipped + dropped) / greatest(sum(admitted + clipped + dropped), 1)
                             FROM window_counts GROUP BY window_id ORDER BY window_id""").fetchall()
    return np.array([share for _, share in rows][:days], dtype=np.float64)


def _chart(path: Path, released: np.ndarray, truth: np.ndarray, noise_std: float, worst_std: float,
           filtered: np.ndarray, summary: DemoSummary) -> Path | None:
    """The demo's picture, one comparison per panel, read in one glance (its title says what
    individual accounting bought: days answered with every user in, against worst-case
    accounting at the same noise):

    1. the first indicator's release and its 95% noise band against the synthetic truth (the band
       covers the sum over the users the filter admitted that day, not every user's:
       :data:`renyi_stream.queries.release_store.ESTIMAND`);
    2. how far the noise reaches each day (the 95% band's half-width) under individual accounting
       and under worst-case accounting answering every day at the same promise;
    3. the share of the day's users the filter left out, from the day the first was.

    Dates on the x axis, one tick per day or few days; legends beside the plots."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # charts are optional: the numbers are printed anyway
        return None
    from renyi_stream.queries.report import date_axis, legend_outside

    n = released.shape[0]
    days = [dt.datetime.combine(START_DAY + dt.timedelta(days=d), dt.time(), dt.timezone.utc) for d in range(n)]
    ends = [day + dt.timedelta(days=1) for day in days]
    worst_stop = summary.worst_case_days_at_same_noise
    first_filtered = summary.days_with_every_user_in
    fig, axes = plt.subplots(3, 1, figsize=(11, 8.4), sharex=True, height_ratios=(1.4, 1.0, 1.0))
    name = INDICATORS[0]
    ax = axes[0]
    ax.fill_between(days, released[:, 0] - 1.96 * noise_std, released[:, 0] + 1.96 * noise_std, color="tab:blue",
                    alpha=0.25, label=f"95% noise band (std {noise_std:.0f}):\ncovers the sum over the users\n"
                    "admitted that day")
    ax.plot(days, released[:, 0], color="tab:blue", lw=1.2, marker="o", markersize=2.5, label="released")
    ax.plot(days, truth[:, 0], color="black", lw=0.9, ls="--", label="synthetic truth\n(curator only)")
    ax.set_title(f"{name}: the daily release against the truth", fontsize=10, loc="left")
    ax.set_ylabel(f"daily sum\n{name}")
    legend_outside(ax)

    ax = axes[1]
    ax.plot(days, np.full(n, 1.96 * noise_std), color="tab:blue", lw=2,
            label=f"individual accounting\n(std {noise_std:.0f}, every day)")
    ax.plot(days, np.full(n, 1.96 * worst_std), color="tab:red", lw=2,
            label=f"worst-case accounting\nanswering all {n} days\n(std {worst_std:.0f})")
    ax.set_ylim(0, 1.96 * max(noise_std, worst_std) * 1.3)
    ax.set_title("how far the noise reaches, same promise", fontsize=10, loc="left")
    ax.set_ylabel("95% band\nhalf-width")
    legend_outside(ax)

    ax = axes[2]
    ax.plot(days[: filtered.size], 100 * filtered, color="tab:purple", lw=1.5, label="users filtered")
    if 0 < first_filtered < n:
        ax.axvline(days[first_filtered], color="tab:purple", lw=1, ls=":")
        ax.annotate("heavy users reach their budget:\ntheir later days are dropped,\nthe others' still count",
                    xy=(days[first_filtered], 0), xytext=(0.35, 0.45), textcoords="axes fraction", fontsize=8,
                    arrowprops={"arrowstyle": "->", "color": "0.4"})
    ax.set_title("share of the day's users the filter left out (curator only)", fontsize=10, loc="left")
    ax.set_ylabel("% of the day's\nusers filtered")
    date_axis(ax, days, ends)
    fig.suptitle(f"Same promise, same noise: individual accounting answered {first_filtered} of {n} days with every "
                 f"user in, worst-case accounting {worst_stop}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _print_summary(config: DemoConfig, s: DemoSummary, cal, out: Path, chart: Path | None) -> None:
    print(f"renyi-stream demo: {config.users:,} users x {config.days} days through the Beam daily job "
          f"(DirectRunner), indicators {', '.join(INDICATORS)}")
    print(f"promise: ({cal.epsilon:g}, {cal.delta:g})-DP per user over all {config.days} days; accounting "
          f"{cal.accounting}; squared-norm budget B = {cal.norm_budget:g}; noise std {cal.noise_std:.2f}")
    print("curator only: exact counts, of synthetic data here (renyi-stream run prints them only without "
          "--quiet; never publish them)")
    print(f"rows read {s.rows_read:,} = admitted {s.admitted:,} + clipped {s.clipped:,} + dropped {s.dropped:,} "
          f"+ rejected {s.rejected:,} + late {s.late:,}  [{'balanced' if s.balanced else 'MISMATCH'}]")
    print()
    print("What individual accounting bought, at the same promise:")
    print(f"  days answered with every user still in: {s.days_with_every_user_in} (individual) vs "
          f"{s.worst_case_days_at_same_noise} (worst case, C^2 = {len(INDICATORS)}, same noise)")
    print(f"  error of the daily sums over all {config.days} days (RMSE against the synthetic truth):")
    print(f"    individual accounting: {s.rmse_individual:8.2f}  (noise std {s.noise_std:.2f}, plus the "
          f"bias of filtered heavy users)")
    print(f"    worst-case accounting: {s.rmse_worst_case_all_days:8.2f}  (noise std needed to answer all "
          f"{config.days} days)")
    print()
    print(f"public releases: {out / 'releases.duckdb'}  (SELECT * FROM releases)")
    print(f"curator files:   {out / 'curator'}  (ledger.duckdb, ledger.noise.key)")
    if chart is not None:
        print(f"chart:           {chart}")
    print(f"done in {s.seconds:.0f} s")
