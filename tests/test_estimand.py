"""Every public surface says what a release estimates (issue 39, item 1).

A release is the noisy sum over the users whose budget admitted them in that window: the
individual filter leaves out users whose budget has run out, so that sum can fall while the
population's does not. The release store (its DuckDB comments, read through ``renyi-stream
sql``, over a store or a Parquet release root), ``releases_with_ci``'s band columns, the HTML
report's chart captions and the docs say so, in the one wording of
:data:`renyi_stream.queries.release_store.ESTIMAND`, and none of them claims that a band covers
the true or population value.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.queries.release_store import ESTIMAND, ReleaseStore, connect_read_only, estimand

from declared import flags

ROOT = Path(__file__).resolve().parents[1]
DOC_PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
DAYS = (dt.date(2026, 3, 1), dt.date(2026, 3, 2))
DECLARED = ("int64", "opened=0:1")
#: The views that carry the estimand as their comment, and the columns that do.
COMMENTED_VIEWS = ("query_catalogue", "releases", "releases_with_ci")
COMMENTED_COLUMNS = {("releases", "value"), ("releases", "noise_std"), ("releases_with_ci", "value"),
                     ("releases_with_ci", "noise_std"), ("releases_with_ci", "ci95_low"),
                     ("releases_with_ci", "ci95_high")}
VIEW_COMMENTS = "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
COLUMN_COMMENTS = ("SELECT table_name, column_name, comment FROM duckdb_columns() "
                   "WHERE NOT internal AND comment IS NOT NULL ORDER BY table_name, column_name")


def _day_file(folder: Path, day: dt.date) -> str:
    path = folder / f"day-{day.isoformat()}.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2, 3], pa.int64()),
                             "day": pa.array([day] * 3, pa.date32()),
                             "opened": pa.array([1.0, 0.0, 1.0])}), path)
    return str(path)


def _run(folder: Path, *extra: str) -> None:
    inputs = [_day_file(folder, day) for day in DAYS]
    assert main(["run", "--input", *inputs, "--store", str(folder / "releases.duckdb"),
                 "--ledger", str(folder / "ledger.duckdb"), "--epsilon", "1", "--delta", "1e-6",
                 "--norm-budget", "4", "--start", DAYS[0].isoformat(), "--end", DAYS[-1].isoformat(),
                 "--shards", "2", "--quiet", *flags(*DECLARED), *extra]) == 0


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A real daily run of two days that also wrote its Parquet release root."""
    folder = tmp_path_factory.mktemp("estimand")
    _run(folder, "--releases-parquet", str(folder / "root"))
    return folder


@pytest.fixture(scope="module")
def released_running(tmp_path_factory) -> Path:
    """A real daily run of two days answering running totals."""
    folder = tmp_path_factory.mktemp("running")
    _run(folder, "--release", "running")
    return folder


def _sql(capsys, statement: str, *source: str) -> list[dict]:
    capsys.readouterr()
    assert main(["sql", statement, *source, "--format", "json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _store(folder: Path) -> tuple[str, str]:
    return ("--store", str(folder / "releases.duckdb"))


def _root(folder: Path) -> tuple[str, str]:
    return ("--releases-parquet", str(folder / "root"))


# --- the release store, through renyi-stream sql -----------------------------------------------------


def test_the_stores_views_say_in_their_comments_what_each_release_estimates(released, capsys):
    comments = {row["view_name"]: row["comment"] for row in _sql(capsys, VIEW_COMMENTS, *_store(released))}
    for view in COMMENTED_VIEWS:
        assert ESTIMAND in comments[view], view


def test_the_value_noise_and_band_columns_say_the_band_covers_the_admitted_sum(released, capsys):
    rows = _sql(capsys, COLUMN_COMMENTS, *_store(released))
    comments = {(row["table_name"], row["column_name"]): row["comment"] for row in rows}
    assert COMMENTED_COLUMNS <= set(comments)
    for column in COMMENTED_COLUMNS:
        assert ESTIMAND in comments[column], column
    assert "covers that admitted sum with probability 95%, not the population's sum" in ESTIMAND


def test_a_parquet_release_root_read_through_sql_carries_the_same_comments_as_the_store(released, capsys):
    for statement in (VIEW_COMMENTS, COLUMN_COMMENTS):
        from_root = _sql(capsys, statement, *_root(released))
        assert from_root == _sql(capsys, statement, *_store(released))
        assert any(ESTIMAND in (row["comment"] or "") for row in from_root)


def test_a_store_whose_comments_are_missing_gets_them_back_when_a_run_opens_it(tmp_path):
    path = tmp_path / "old.duckdb"
    ReleaseStore(path).close()
    db = duckdb.connect(str(path))  # a store written before the comments existed
    for view in COMMENTED_VIEWS:
        db.execute(f"COMMENT ON VIEW {view} IS NULL")
    db.close()
    ReleaseStore(path, read_only=True).close()  # a read-only open writes nothing
    db = connect_read_only(path)
    assert db.execute("SELECT count(comment) FROM duckdb_views() WHERE view_name = 'releases'").fetchone() == (0,)
    db.close()
    ReleaseStore(path).close()  # the next run's read-write open
    db = connect_read_only(path)
    assert db.execute("SELECT comment FROM duckdb_views() WHERE view_name = 'releases'").fetchone()[0].endswith(ESTIMAND)
    db.close()


# --- the HTML report ------------------------------------------------------------------------------


class _Captions(HTMLParser):
    """The text of each ``<figure>``'s ``<figcaption>`` and the alt of its image."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict] = []
        self._in_caption = False

    def handle_starttag(self, tag, attrs):
        if tag == "figure":
            self.figures.append({"alt": None, "caption": ""})
        elif tag == "img" and self.figures:
            self.figures[-1]["alt"] = dict(attrs).get("alt")
        elif tag == "figcaption":
            self._in_caption = True

    def handle_endtag(self, tag):
        if tag == "figcaption":
            self._in_caption = False

    def handle_data(self, data):
        if self._in_caption:
            self.figures[-1]["caption"] += data


def _report(folder: Path, out: Path, *source: str) -> str:
    assert main(["report", *source, "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def _figures(page: str) -> list[dict]:
    parser = _Captions()
    parser.feed(page)
    return parser.figures


def test_each_chart_of_the_report_is_captioned_with_what_its_values_estimate(released, tmp_path):
    figures = _figures(_report(released, tmp_path / "r.html", *_store(released)))
    assert [figure["alt"] for figure in figures] == ["sum:opened"]
    for figure in figures:
        assert estimand("window") in figure["caption"]
        assert "the sum over the users whose budget admitted them in that window" in figure["caption"]


def test_a_running_total_chart_is_captioned_with_the_running_estimand(released_running, tmp_path):
    figures = _figures(_report(released_running, tmp_path / "r.html", *_store(released_running)))
    assert figures and all(estimand("running") in figure["caption"] for figure in figures)


def test_the_report_of_a_parquet_release_root_carries_the_same_captions(released, tmp_path):
    from_root = _figures(_report(released, tmp_path / "root.html", *_root(released)))
    from_store = _figures(_report(released, tmp_path / "store.html", *_store(released)))
    assert [f["caption"] for f in from_root] == [f["caption"] for f in from_store]


def test_the_report_claims_no_coverage_of_a_true_value(released, tmp_path):
    page = _report(released, tmp_path / "r.html", *_store(released))
    text = re.sub(r"<[^>]+>", " ", page)
    assert "true value" not in text.lower()
    assert _coverage_claims(text) == []


# --- the docs ---------------------------------------------------------------------------------------

#: Words that name the 95% band, words that claim it holds something, the sums it does not cover.
_BAND = re.compile(r"\b(band|bands|interval|intervals|ci95_\w+)\b", re.I)
_HOLDS = re.compile(r"\b(covers?|covered|coverage|contains?|inside|within|for)\b", re.I)
_TRUTH = re.compile(r"\b(true (value|sum|total|count)s?|truth|population(?:'s)?)\b", re.I)
_TRUTH_INSIDE = re.compile(r"\b(true (value|sum|total|count)s?|truth|population(?:'s)? (sum|total|value))\b"
                           r"[^.;:]{0,20}\b(is|are|lies|lie|falls?) (inside|within|in)\b", re.I)
_NEGATION = re.compile(r"\b(not|never|nothing|no)\b|n't\b", re.I)
_CLOSE = 40  # characters from the word of holding to the sum it names


def _sentences(text: str) -> list[str]:
    """The sentences of a Markdown page (or of plain text): a paragraph, a list item, a heading or
    a table row ends a sentence too."""
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[*#|>-]|\d+\.)\s)", text)
    return [sentence.strip() for block in blocks
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[])", re.sub(r"\s+", " ", block))
            if sentence.strip()]


def _coverage_claims(text: str) -> list[str]:
    """Sentences of ``text`` that say a band covers the true or population value: a band word and
    either a word of holding followed closely by a truth word with no negation between them
    ("covers the true value", "interval for the true value", but not "covers the admitted sum,
    not the population's"), or a truth word said to be inside something ("the true value is
    inside the band")."""
    claims = []
    for sentence in _sentences(text):
        if not _BAND.search(sentence):
            continue
        if _TRUTH_INSIDE.search(sentence):
            claims.append(sentence)
            continue
        for hold in _HOLDS.finditer(sentence):
            truth = _TRUTH.search(sentence, hold.end(), hold.end() + _CLOSE)
            if truth is not None and not _NEGATION.search(sentence, hold.end(), truth.start()):
                claims.append(sentence)
                break
    return claims


def test_the_claim_finder_catches_the_old_wordings_and_passes_the_estimand():
    old = ["Gaussian noise of standard deviation 3: the true value is inside the shaded band (value ± 1.96 × std) "
           "with probability 95%.",
           "released: 95% interval for the true value (noise std 12)",
           "The 95% band covers the population's sum.",
           "The truth lies within the interval 19 times in 20."]
    assert [len(_coverage_claims(text)) for text in old] == [1, 1, 1, 1]
    assert _coverage_claims(ESTIMAND) == []


def test_no_doc_says_a_band_covers_the_true_or_population_value():
    claims = [f"{page.relative_to(ROOT)}: {claim}" for page in DOC_PAGES
              for claim in _coverage_claims(page.read_text(encoding="utf-8"))]
    assert claims == []


def test_the_docs_quote_the_estimand_in_its_one_wording():
    page = (ROOT / "docs" / "daily_job.md").read_text(encoding="utf-8")
    quoted = " ".join(line[2:] for line in page.splitlines() if line.startswith("> "))
    assert " ".join(ESTIMAND.split()) in " ".join(quoted.split())


def test_no_analyst_facing_module_says_a_band_covers_the_true_or_population_value():
    # the analysts' side, and the demo, whose chart a new user reads first
    modules = [*sorted((ROOT / "queries").glob("*.py")), ROOT / "pipelines" / "daily" / "demo.py"]
    claims = [f"{path.relative_to(ROOT)}: {claim}" for path in modules
              for claim in _coverage_claims(path.read_text(encoding="utf-8"))]
    assert claims == []
