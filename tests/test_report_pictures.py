"""The report's pictures read at a glance (issue 39, item 5): day ticks for daily windows (never
hours on a two-day series), the legend beside the plot rather than over it, charts at the page's
full width, and a line saying a value below zero is noise, only where one is."""

from __future__ import annotations

import datetime as dt
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402

from renyi_stream.pipelines.curator.ledger_report import budget_sentence  # noqa: E402
from renyi_stream.queries.release_store import RELEASE_SCHEMA, ReleaseStore  # noqa: E402
from renyi_stream.queries.report import (MAX_DATE_TICKS, NEGATIVE_IS_NOISE, _STYLE, date_axis,  # noqa: E402
                                         legend_outside, render_report)

START = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


def _tick_labels(starts, ends):
    fig, ax = plt.subplots(figsize=(11, 3.4))
    ax.plot(starts, range(len(starts)), label="x")
    date_axis(ax, starts, ends)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    plt.close(fig)
    return labels


def _days(n):
    starts = [START + dt.timedelta(days=d) for d in range(n)]
    return starts, [s + dt.timedelta(days=1) for s in starts]


def test_a_two_day_series_of_daily_windows_is_ticked_by_day_not_by_hour():
    assert _tick_labels(*_days(2)) == ["Mar 01", "Mar 02"]


@pytest.mark.parametrize("days", [5, 30, 90, 365])
def test_a_series_of_daily_windows_gets_at_most_ten_date_ticks_and_no_hours(days):
    labels = _tick_labels(*_days(days))
    assert 2 <= len(labels) <= MAX_DATE_TICKS
    assert not any(":" in label for label in labels)


def test_hourly_windows_keep_automatic_ticks():
    starts = [START + dt.timedelta(hours=h) for h in range(12)]
    labels = _tick_labels(starts, [s + dt.timedelta(hours=1) for s in starts])
    assert any(":" in label for label in labels)  # hours are what an hourly series is about


def test_the_legend_sits_right_of_the_plot_not_over_the_data():
    fig, ax = plt.subplots(figsize=(11, 3.4))
    ax.plot([0, 1], [0, 1], label="a long label for one coordinate")
    legend_outside(ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
    plt.close(fig)


def test_charts_take_the_full_width_of_the_page():
    assert "img{width:100%" in _STYLE


def _store(tmp_path, values):
    rows = [{"query_id": "sum:opened", "window_id": w, "window_start": START + dt.timedelta(days=w),
             "window_end": START + dt.timedelta(days=w + 1), "label": "opened", "coordinate": 0, "value": v,
             "noise_std": 3.0, "kind": "window", "accounting": "gdp", "mechanism": "gaussian",
             "key_fingerprint": "0" * 16} for w, v in enumerate(values)]
    path = tmp_path / "s.duckdb"
    with ReleaseStore(path) as store:
        store.publish(pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA))
        store.record_promise(epsilon=1.0, delta=1e-6, accounting="gdp", norm_budget=5.0)
    return path


def _caption(path):
    text = path.read_text(encoding="utf-8")
    return re.search(r"<figcaption class='note'>(.*?)</figcaption>", text).group(1)


def test_a_chart_with_a_negative_release_says_that_below_zero_is_noise(tmp_path):
    page = render_report(_store(tmp_path, [4.0, -2.5, 3.0]), tmp_path / "r.html")
    assert NEGATIVE_IS_NOISE.replace("'", "&#x27;") in _caption(page)


def test_a_chart_without_a_negative_release_does_not(tmp_path):
    page = render_report(_store(tmp_path, [4.0, 2.5, 3.0]), tmp_path / "r.html")
    assert "below zero" not in _caption(page)


def test_the_curators_sentence_gives_the_last_windows_date_beside_its_number():
    text = budget_sentence(pa.array([0.5]).to_numpy(), [(20501, 10, 0, 2)], lambda w: "2026-02-18")
    assert "The last window (20501, starting 2026-02-18) dropped 2" in text
