"""The HTML report (issue 4): self-contained, one chart per query, curator variant apart."""

from __future__ import annotations

import base64
import datetime as dt
import io
from html.parser import HTMLParser

import matplotlib.image as mpimg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.daily_job import JobConfig, run_job

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[str, str]] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append((attrs.get("alt", ""), attrs["src"]))
        for name in ("src", "href"):
            if attrs.get(name) and not attrs[name].startswith("data:"):
                self.external.append(attrs[name])


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    path = tmp / "d.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2, 3], type=pa.int64()),
                             "day": pa.array([DAY0] * 3, type=pa.date32()),
                             "opened": pa.array([1.0, 0.0, 1.0]), "bought": pa.array([0.0, 1.0, 1.0])}), path)
    config = JobConfig(inputs=(str(path),), store=str(tmp / "s.duckdb"), ledger=str(tmp / "l.duckdb"), epsilon=1.0,
                       delta=1e-6, norm_budget=5.0, start_window=W0, end_window=W0 + 3, key_path=str(tmp / "k.key"),
                       n_shards=2)
    run_job(config)
    return tmp, config


def _parse(path) -> _Images:
    parser = _Images()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_the_public_report_has_one_decodable_chart_per_query_and_nothing_external(stores, capsys):
    tmp, config = stores
    out = tmp / "report.html"
    assert main(["report", "--store", config.store, "--out", str(out)]) == 0
    page = _parse(out)
    assert [alt for alt, _ in page.images] == ["sum:bought", "sum:opened"]
    for _, src in page.images:
        assert src.startswith("data:image/png;base64,")
        pixels = mpimg.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")
        assert pixels.shape[0] > 100 and pixels.shape[1] > 300
    assert page.external == []
    text = out.read_text(encoding="utf-8")
    assert "(1, 1e-06)-differential privacy" in text
    assert "Curator" not in text and "budget used" not in text


def test_the_curator_report_adds_budget_and_filtering_charts(stores):
    tmp, config = stores
    out = tmp / "curator.html"
    assert main(["report", "--store", config.store, "--ledger", config.ledger, "--out", str(out)]) == 0
    alts = [alt for alt, _ in _parse(out).images]
    assert alts == ["sum:bought", "sum:opened", "budget used", "share filtered"]
    assert "never publish" in out.read_text(encoding="utf-8")


def test_a_missing_store_exits_1_naming_it(tmp_path, capsys):
    assert main(["report", "--store", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "r.html")]) == 1
    assert "--store" in capsys.readouterr().err
