"""A self-contained HTML report of the released answers (charts embedded as base64 PNG).

The public report reads only the release store: each query's released series with its 95%
band (Gaussian noise of known std, so ``value -/+ 1.96 noise_std`` covers, with probability 95%,
the sum over the users whose budget admitted them in that window: not the population's sum,
which the individual filter changes), and the promise in plain words. Each chart's caption says
so in the words of :func:`renyi_stream.queries.release_store.estimand`, the one wording every
public surface uses. It holds nothing pre-noise, so it
may be published wherever the store may.

The curator variant adds, from the ledger, the distribution of the budget users have used and
the share of active users filtered (dropped or clipped) per window. Those are computed from
users' data without noise (invariant 4 (nothing-pre-noise-leaves, docs/architecture.md)): the page
says so and stays with the curator.

The page needs nothing outside itself: no scripts, no fonts, no links; charts are PNG data URIs
drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.queries.release_store import ESTIMAND, ReleaseStore, estimand
from renyi_stream.stream.private_files import write_private_bytes

_Z95 = 1.959963984540054
_MAX_LEGEND = 12  # a histogram with more coordinates gets no legend (the lines say enough)
# Charts at the page's full width: the image scales to the column, which is wide enough for a
# quarter's daily ticks to read.
_STYLE = ("body{font-family:sans-serif;max-width:72em;margin:2em auto;padding:0 1em;color:#222}"
          "img{width:100%;height:auto;display:block;margin:.5em 0 1.5em}h2{margin-top:1.6em}"
          "figure{margin:0 0 1.5em}figure img{margin-bottom:.3em}"
          ".curator{border-left:4px solid #b00;padding-left:1em}.note{color:#555;font-size:.92em}")


def render_report(store: str | os.PathLike, out: str | os.PathLike, *,
                  curator_part: Callable[[Any], str] | None = None) -> Path:
    """Write the HTML report of ``store`` to ``out`` and return its path.

    Public variant (``curator_part`` None): reads only the release store (opened read-only), one
    chart per released query, in query id order. With ``curator_part`` (a function of pyplot
    returning HTML, :func:`renyi_stream.pipelines.curator.ledger_report.render_curator_report` passes the
    ledger's), the curator variant: the same, then that part, written ``0600`` whatever the umask
    (:mod:`renyi_stream.stream.private_files`). This module reads no ledger: the analysts' side imports nothing
    from the curator's.
    """
    with ReleaseStore(store, read_only=True) as release_store:
        releases = release_store.read()
        promise = release_store.promise()
    plt = _pyplot()
    query_ids = sorted(set(releases.column("query_id").to_pylist()))
    sections = [_query_section(plt, releases.filter(pc.equal(releases.column("query_id"), q)), q) for q in query_ids]
    curator = curator_part(plt) if curator_part is not None else ""
    title = "renyi-stream releases" + (" (curator report: contains sensitive counts)" if curator_part is not None else "")
    count = f"{len(query_ids)} quer{'y' if len(query_ids) == 1 else 'ies'}"
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{_promise_words(promise)}"
            f"<p>{releases.num_rows:,} released numbers for {count}.</p>"
            + "".join(sections) + curator + "</body></html>")
    path = Path(out)
    if curator_part is not None:  # the curator variant is a curator file: 0600 whatever the umask
        write_private_bytes(path, page.encode("utf-8"), make_parents=False)
    else:
        path.write_text(page, encoding="utf-8")
    return path


# --- public part ---------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart_png(plt: Any, fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def image_html(alt: str, png: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'


#: The most ticks a date axis gets: a 90-day series shows every 12th day, a 2-day series each day.
MAX_DATE_TICKS = 10
_DAY = dt.timedelta(days=1)


def date_axis(ax: Any, starts: list[dt.datetime], ends: list[dt.datetime]) -> None:
    """Ticks for a series of windows starting at ``starts`` and ending at ``ends``: when every
    window is a whole UTC day, one tick per day or per few days (at most :data:`MAX_DATE_TICKS`),
    labelled by date, never by hour (a two-day series is two days, not 48 hours); other windows
    get matplotlib's automatic date ticks, in one concise format."""
    import matplotlib.dates as mdates
    from matplotlib.ticker import FixedLocator

    days = bool(starts) and all(e - s == _DAY and s.hour == s.minute == s.second == 0 for s, e in zip(starts, ends))
    if days:
        # Ticks counted from the first day (a DayLocator's interval restarts every month), every
        # ``step`` days, so a series gets at most MAX_DATE_TICKS evenly spaced dates.
        first, span = min(starts), (max(starts) - min(starts)).days + 1
        step = max(1, math.ceil(span / MAX_DATE_TICKS))
        ticks = [first + dt.timedelta(days=d) for d in range(0, span, step)]
        ax.xaxis.set_major_locator(FixedLocator(mdates.date2num(ticks)))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%b %d" if span < 300 else "%Y-%m-%d"))
        if span <= 120:  # each day's place, unlabelled, where the days can be told apart
            ax.xaxis.set_minor_locator(FixedLocator(mdates.date2num([first + dt.timedelta(days=d)
                                                                     for d in range(span)])))
        return
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # one tick format, not a mix


def legend_outside(ax: Any) -> None:
    """The legend to the right of the plot, so it never hides a point or a band."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, borderaxespad=0.0)


#: The caption's line for a chart with a value below zero.
NEGATIVE_IS_NOISE = ("A value below zero is noise: the sum it estimates is never negative, and a negative release "
                     "says that sum is small against the noise (the band shows how far the noise reaches).")


def _query_section(plt: Any, table: pa.Table, query_id: str) -> str:
    """One query: a heading, what was released in words, and one chart of every coordinate."""
    table = table.sort_by([("coordinate", "ascending"), ("window_id", "ascending")])
    kind = table.column("kind")[0].as_py()
    windows = pc.count_distinct(table.column("window_id")).as_py()
    coordinates = pc.unique(table.column("coordinate")).to_pylist()
    std = table.column("noise_std").to_numpy()
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for coordinate in coordinates:
        part = table.filter(pc.equal(table.column("coordinate"), coordinate))
        x = part.column("window_start").to_pylist()
        y = part.column("value").to_numpy()
        band = _Z95 * part.column("noise_std").to_numpy()
        label = part.column("label")[0].as_py()
        if windows == 1:  # one window: a point with its interval, not a band nobody can see
            ax.errorbar(x, y, yerr=band, fmt="o", capsize=4, label=label)
        else:
            ax.plot(x, y, marker="o", markersize=2.5, linewidth=1.2, label=label)
            ax.fill_between(x, y - band, y + band, alpha=0.2)
    if windows == 1:  # a day either side, not an axis of years around a lone point
        start, end = table.column("window_start")[0].as_py(), table.column("window_end")[0].as_py()
        ax.set_xlim(start - (end - start), end)
    what = "running total" if kind == "running" else "per window"
    ax.set_title(f"{query_id} ({what}) over admitted users, 95% noise {'interval' if windows == 1 else 'band'}")
    ax.set_xlabel("window start (UTC)")
    ax.grid(alpha=0.3)
    values = table.column("value").to_numpy()
    negative = bool((values < 0).any())
    if negative:  # where zero is, so a release below it reads as noise around a small sum
        ax.axhline(0.0, color="#444", linewidth=0.8)
    if len(coordinates) <= _MAX_LEGEND:
        legend_outside(ax)
    date_axis(ax, table.column("window_start").to_pylist(), table.column("window_end").to_pylist())
    noise = f"{std.min():.4g}" if np.ptp(std) == 0 else f"{std.min():.4g} to {std.max():.4g}"
    words = (f"{windows} window(s) released, {len(coordinates)} coordinate(s) each, with Gaussian noise of "
             f"standard deviation {noise}. {estimand(kind)}" + (f" {NEGATIVE_IS_NOISE}" if negative else ""))
    return (f"<h2>{html.escape(query_id)}</h2><figure>{image_html(query_id, chart_png(plt, fig))}"
            f"<figcaption class='note'>{html.escape(words)}</figcaption></figure>")


def _promise_words(promise: dict[str, str]) -> str:
    if not promise:
        return "<p>The store does not record the privacy promise (it was written by an older version).</p>"
    eps, delta = float(promise["epsilon"]), float(promise["delta"])
    return (f"<p>Every user in this data is protected by <b>({eps:g}, {delta:g})-differential privacy</b> over "
            "everything ever released from it, whatever questions were asked and in whatever order: the released "
            f"numbers change by at most a factor e<sup>{eps:g}</sup> in probability (except with probability "
            f"{delta:g}) whether or not any one user's data is used. Each user's contributions are charged to a "
            f"personal budget (squared-norm budget {float(promise['norm_budget']):g}, "
            f"{html.escape(promise['accounting'])} accounting); a user whose budget would be exceeded is left out "
            "of a release instead. Every number below carries Gaussian noise whose standard deviation is shown "
            f"as a 95% band. {html.escape(ESTIMAND)}</p>")
