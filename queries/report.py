"""A self-contained HTML report of the released answers (charts embedded as PNG).

The public report reads only the release store: each query's released series with its 95%
confidence band (Gaussian noise of known std, so ``value -/+ 1.96 noise_std`` is exact), and the
promise in plain words. The curator variant adds, from the ledger, the distribution of budget
used and the share of rows filtered (dropped or clipped) per window: sensitive, for the curator.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from queries.release_store import ReleaseStore

_Z95 = 1.959963984540054


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series_chart(plt, table: pa.Table, query_id: str) -> str:
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for coordinate in sorted(set(table.column("coordinate").to_pylist())):
        part = table.filter(pc.equal(table.column("coordinate"), coordinate)).sort_by("window_id")
        x = part.column("window_start").to_pylist()
        y = np.asarray(part.column("value").to_pylist())
        band = _Z95 * np.asarray(part.column("noise_std").to_pylist())
        label = part.column("label")[0].as_py()
        ax.plot(x, y, marker="o", markersize=2.5, linewidth=1.2, label=label)
        ax.fill_between(x, y - band, y + band, alpha=0.2)
    kind = table.column("kind")[0].as_py()
    ax.set_title(f"{query_id} ({'running total' if kind == 'running' else 'per window'}), 95% confidence band")
    ax.set_xlabel("window start (UTC)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    out = _png(fig)
    plt.close(fig)
    return out


def _promise_words(promise: dict[str, str]) -> str:
    if not promise:
        return "<p>The store does not record the privacy promise (it was written by an older version).</p>"
    eps, delta = float(promise["epsilon"]), float(promise["delta"])
    return (f"<p>Every user in this data is protected by <b>({eps:g}, {delta:g})-differential privacy</b> over "
            "everything ever released from it, whatever questions were asked and in whatever order: the released "
            f"numbers change by at most a factor e<sup>{eps:g}</sup> in probability (except with probability "
            f"{delta:g}) whether or not any one user's data is used. Each user's contributions are charged to a "
            f"personal budget (squared-norm budget {float(promise['norm_budget']):g}, {promise['accounting']} "
            "accounting); a user whose budget would be exceeded is left out of a release instead. Every number "
            "below carries Gaussian noise whose standard deviation is shown as a 95% band.</p>")


def render_report(store: str | os.PathLike, out: str | os.PathLike, *, ledger: str | os.PathLike | None = None) -> Path:
    """Write the HTML report of ``store`` to ``out``; with ``ledger``, the curator variant."""
    with ReleaseStore(store, read_only=True) as release_store:
        releases = release_store.read()
        promise = release_store.promise()
    plt = _figure()
    sections = []
    for query_id in sorted(set(releases.column("query_id").to_pylist())):
        part = releases.filter(pc.equal(releases.column("query_id"), query_id))
        windows = len(set(part.column("window_id").to_pylist()))
        sections.append(f"<h2>{html.escape(query_id)}</h2><p>{windows} window(s) released.</p>"
                        f'<img alt="{html.escape(query_id)}" src="data:image/png;base64,{_series_chart(plt, part, query_id)}">')
    curator = _curator_sections(plt, Path(ledger)) if ledger is not None else ""
    title = "renyi-stream releases" + (" (curator report: contains sensitive counts)" if ledger else "")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
            "img{max-width:100%}</style></head><body>"
            f"<h1>{title}</h1>{_promise_words(promise)}"
            f"<p>{releases.num_rows} released numbers for {len(sections)} quer{'y' if len(sections) == 1 else 'ies'}.</p>"
            + "".join(sections) + curator + "</body></html>")
    path = Path(out)
    path.write_text(page, encoding="utf-8")
    return path


def _curator_sections(plt, ledger: Path) -> str:
    from queries.privacy_report import load_ledger

    params, book = load_ledger(ledger)
    used = book.to_arrow().column("used").to_numpy() / params.rho if len(book) else np.zeros(0)
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.hist(used, bins=np.linspace(0, 1, 41), color="tab:purple")
    ax.set_xlabel("share of the personal budget used")
    ax.set_ylabel("users")
    ax.set_title(f"budget used, {len(book):,} users")
    budget_png = _png(fig)
    plt.close(fig)
    db = duckdb.connect(str(ledger), read_only=True)
    try:
        rows = db.execute("SELECT window_id, sum(admitted), sum(clipped), sum(dropped) FROM window_counts "
                          "GROUP BY window_id ORDER BY window_id").fetchall()
    finally:
        db.close()
    fig, ax = plt.subplots(figsize=(8, 3))
    if rows:
        windows = [r[0] for r in rows]
        filtered = [(r[2] + r[3]) / max(r[1] + r[2] + r[3], 1) for r in rows]
        ax.plot(windows, filtered, marker="o", markersize=2.5)
    ax.set_xlabel("window id")
    ax.set_ylabel("share of rows filtered")
    ax.set_title("rows dropped or clipped by the individual filter")
    filtered_png = _png(fig)
    plt.close(fig)
    return ("<h2>Curator only: budgets and filtering</h2><p>These charts are computed from users' data without "
            "noise: keep them with the ledger, never publish them.</p>"
            f'<img alt="budget used" src="data:image/png;base64,{budget_png}">'
            f'<img alt="share filtered" src="data:image/png;base64,{filtered_png}">')
