"""The curator variant of the HTML report: the public report of the release store
(:func:`renyi_stream.queries.report.render_report`) followed by the ledger's budget and filtering charts.

Those charts are computed from users' data without noise (invariant 4, nothing-pre-noise-leaves,
docs/architecture.md): the page says so, and it is written ``0600`` to stay with the curator.
"""

from __future__ import annotations

import datetime as dt
import os
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from renyi_stream.pipelines.curator.privacy_report import load_ledger
from renyi_stream.pipelines.curator.store import connect_curator
from renyi_stream.queries.report import chart_png, date_axis, image_html, legend_outside, render_report
from renyi_stream.stream.private_files import private_umask


def render_curator_report(store: str | os.PathLike, out: str | os.PathLike, ledger: str | os.PathLike) -> Path:
    """Write the curator report of ``store`` and ``ledger`` (both opened read-only) to ``out``, ``0600``."""
    return render_report(store, out, curator_part=partial(curator_sections, ledger=Path(ledger)))


def budget_sentence(used: np.ndarray, counts: list[tuple[int, int, int, int]],
                    window_start: Callable[[int], str] | None = None) -> str:
    """What the filter did, in words: users whose budget is used up, and the contributions
    dropped and clipped (``counts``: per window, admitted, clipped, dropped), last window and in
    all. A contribution is dropped when it would take its user past the budget, so users with
    some budget left are dropped too: counting only used-up budgets said "1 of 1,975 users" on a
    window that dropped 204. ``window_start``: a window's start as text, written beside its number."""
    exhausted = int(np.count_nonzero(used >= 1 - 1e-6))
    text = f"{exhausted:,} of {len(used):,} users have used their whole budget."
    if counts:
        window, _, clipped, dropped = counts[-1]
        all_clipped, all_dropped = sum(r[2] for r in counts), sum(r[3] for r in counts)
        when = f"{window}, starting {window_start(window)}" if window_start is not None else f"{window}"
        text += (f" The last window ({when}) dropped {dropped:,} and clipped {clipped:,} users' contributions; "
                 f"all {len(counts):,} windows, {all_dropped:,} dropped and {all_clipped:,} clipped. A contribution "
                 "is dropped (or clipped) when it would take its user past their budget, so users with budget "
                 "left are dropped too.")
    return text


def curator_sections(plt: Any, ledger: Path) -> str:
    """The curator-only HTML: the distribution of the budget used and the share of active users
    filtered per window, computed from the ledger without noise (invariant 4,
    nothing-pre-noise-leaves: the page says so and stays with the curator)."""
    params, book = load_ledger(ledger)
    used = book.to_arrow().column("used").to_numpy() / params.rho if len(book) else np.zeros(0)
    fig, ax = plt.subplots(figsize=(11, 3))
    ax.hist(used, bins=np.linspace(0, 1, 41), color="tab:purple")
    ax.set_xlabel("share of the personal budget used")
    ax.set_ylabel("users")
    ax.set_title(f"budget used, {len(book):,} users")
    budget_png = chart_png(plt, fig)

    with private_umask(), connect_curator(ledger, read_only=True) as db:  # spills: 0600 in <ledger>.tmp/
        rows = db.execute("SELECT window_id, sum(admitted), sum(clipped), sum(dropped) FROM window_counts "
                          "GROUP BY window_id ORDER BY window_id").fetchall()
    def start_text(window: int) -> str:
        start = dt.datetime.fromtimestamp(params.origin_seconds + window * params.window_seconds, dt.timezone.utc)
        return start.strftime("%Y-%m-%d" if params.window_seconds % 86_400 == 0 else "%Y-%m-%d %H:%M UTC")

    fig, ax = plt.subplots(figsize=(11, 3))
    if rows:
        starts = [dt.datetime.fromtimestamp(params.origin_seconds + int(r[0]) * params.window_seconds, dt.timezone.utc)
                  for r in rows]
        ax.plot(starts, [(r[2] + r[3]) / max(r[1] + r[2] + r[3], 1) for r in rows], marker="o", markersize=2.5,
                label="dropped or clipped")
        ax.plot(starts, [r[3] / max(r[1] + r[2] + r[3], 1) for r in rows], linestyle="--", label="dropped")
        legend_outside(ax)
        width = dt.timedelta(seconds=params.window_seconds)
        date_axis(ax, starts, [start + width for start in starts])
    ax.set_xlabel("window start (UTC)")
    ax.set_ylabel("share of active users")
    ax.set_title("users filtered by the individual filter, per window")
    filtered_png = chart_png(plt, fig)
    return ("<div class='curator'><h2>Curator only: budgets and filtering</h2><p>These charts are computed from "
            f"users' data without noise: keep them with the ledger, never publish them. {budget_sentence(used, rows, start_text)}</p>"
            f"{image_html('budget used', budget_png)}{image_html('share filtered', filtered_png)}</div>")
