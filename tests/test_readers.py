"""Input files: each format reads, and each broken file fails with a message naming it."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from renyi_stream.stream.arrow_compat import parquet_writable
from renyi_stream.stream.engine import readers
from renyi_stream.stream.engine.readers import InputFileError, MalformedLines, read_batches

TABLE = pa.table({
    "user_id": pa.array([1, 2, 3], type=pa.int64()),
    "day": pa.array([dt.date(2026, 3, 1)] * 3, type=pa.date32()),
    "opened": pa.array([1.0, 0.0, 1.0]),
})


def _rows(path) -> int:
    return sum(b.num_rows for b in read_batches(path, batch_rows=2))


def test_parquet_arrow_file_arrow_stream_and_csv_all_read(tmp_path):
    pq.write_table(TABLE, tmp_path / "a.parquet")
    with ipc.new_file(tmp_path / "b.arrow", TABLE.schema) as writer:
        writer.write_table(TABLE)
    with ipc.new_stream(tmp_path / "c.ipc", TABLE.schema) as writer:
        writer.write_table(TABLE)
    pacsv.write_csv(TABLE, tmp_path / "d.csv")
    assert [_rows(tmp_path / n) for n in ("a.parquet", "b.arrow", "c.ipc", "d.csv")] == [3, 3, 3, 3]


def test_batches_are_at_most_the_requested_size(tmp_path):
    pq.write_table(TABLE, tmp_path / "a.parquet")
    assert [b.num_rows for b in read_batches(tmp_path / "a.parquet", batch_rows=2)] == [2, 1]


def test_an_unknown_extension_is_refused_naming_the_file(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(InputFileError, match="x.json"):
        list(read_batches(tmp_path / "x.json"))


def test_a_missing_file_is_refused_naming_it(tmp_path):
    with pytest.raises(InputFileError, match="absent.parquet"):
        list(read_batches(tmp_path / "absent.parquet"))


def test_a_truncated_parquet_file_is_refused_naming_it(tmp_path):
    pq.write_table(TABLE, tmp_path / "a.parquet")
    data = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFileError, match="cut.parquet"):
        list(read_batches(tmp_path / "cut.parquet"))


def test_an_arrow_stream_cut_mid_batch_is_refused_naming_it(tmp_path):
    with ipc.new_stream(tmp_path / "s.arrow", TABLE.schema) as writer:
        writer.write_table(TABLE)
    data = (tmp_path / "s.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) - 40])
    with pytest.raises(InputFileError, match="cut.arrow"):
        list(read_batches(tmp_path / "cut.arrow"))


def test_a_file_that_is_not_what_its_extension_says_is_refused(tmp_path):
    pacsv.write_csv(TABLE, tmp_path / "really-csv.parquet")
    with pytest.raises(InputFileError, match="really-csv.parquet"):
        list(read_batches(tmp_path / "really-csv.parquet"))


def test_an_empty_file_is_refused_naming_it(tmp_path):
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(InputFileError, match="empty.parquet"):
        list(read_batches(tmp_path / "empty.parquet"))


def test_every_csv_column_user_id_included_is_read_as_text_whatever_its_values_look_like(tmp_path):
    (tmp_path / "d.csv").write_text("user_id,day,count,flag,when,empty,mixed\n"
                                    "1,2026-03-01,3,true,2026-03-01,,1\n"
                                    "2,2026-03-01,4,false,2026-03-02,,x\n")
    [batch] = list(read_batches(tmp_path / "d.csv"))
    assert batch.schema.field("user_id").type == pa.string()  # the ledger's declared id type parses it
    assert batch.column("user_id").to_pylist() == ["1", "2"]
    assert [batch.schema.field(c).type for c in ("day", "count", "flag", "when", "empty", "mixed")] == [pa.string()] * 6
    assert batch.column("count").to_pylist() == ["3", "4"] and batch.column("empty").to_pylist() == ["", ""]


# --- the line-by-line CSV reader under attack (issue 28's review) ----------------------------------


def _csv_rows(path) -> tuple[list[dict], list[tuple[int, str, str]]]:
    malformed = MalformedLines()
    rows = [r for b in read_batches(path, malformed=malformed) for r in b.to_pylist()]
    return rows, list(malformed)


def test_a_too_long_line_ending_exactly_at_a_chunk_boundary_loses_no_line_after_it(tmp_path):
    # The reader reads 8 MiB chunks; a too-long line whose newline is the last byte of a chunk
    # once ended the read there, silently: the lines after it were never read nor counted.
    from renyi_stream.stream.engine import readers

    header = b"user_id,day,opened\n"
    long_line = b"9" * (2 * readers._CHUNK_BYTES - len(header) - 1) + b"\n"
    (tmp_path / "d.csv").write_bytes(header + long_line + b"1,2026-03-01,1\n2,2026-03-01,0\n")
    rows, malformed = _csv_rows(tmp_path / "d.csv")
    assert [r["user_id"] for r in rows] == ["1", "2"]
    assert [(line, why) for line, _, why in malformed] == [(2, f"longer than {readers.MAX_LINE_BYTES} bytes")]


@pytest.mark.parametrize("cut", [-2, -1, 0, 1, 2])
def test_every_line_after_a_too_long_line_is_read_wherever_the_chunks_fall(tmp_path, monkeypatch, cut):
    from renyi_stream.stream.engine import readers

    monkeypatch.setattr(readers, "_CHUNK_BYTES", 64)
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 20)
    header = b"user_id,day,opened\n"
    long_line = b"9" * (2 * 64 - len(header) - 1 + cut) + b"\n"
    good = b"".join(b"%d,2026-03-01,1\n" % i for i in range(30))
    (tmp_path / "d.csv").write_bytes(header + long_line + good)
    rows, malformed = _csv_rows(tmp_path / "d.csv")
    assert [r["user_id"] for r in rows] == [str(i) for i in range(30)]
    assert [line for line, _, _ in malformed] == [2]


class _CountingNumpy:
    """numpy, counting the elements every ``cumsum`` call scans (the reader's per-line counts)."""

    def __init__(self) -> None:
        self.scanned = 0

    def __getattr__(self, name):
        return getattr(np, name)

    def cumsum(self, a, *args, **kwargs):
        self.scanned += np.size(a)
        return np.cumsum(a, *args, **kwargs)


@pytest.mark.parametrize("line", [b"a", b"\xff,b,c"])
def test_many_malformed_lines_are_read_with_work_linear_in_the_file(tmp_path, monkeypatch, line):
    # Each line with a wrong field count recounted the commas of the whole chunk, and each line
    # that is not UTF-8 copied the rest of the chunk: quadratic, so one 160 kB file of bad lines
    # took most of a minute (an 8 MiB one, a day). Counted, not timed: the per-line scans cover
    # each byte a bounded number of times, however many lines are bad.
    counting = _CountingNumpy()
    monkeypatch.setattr(readers, "np", counting)
    body = b"user_id,day,opened\n" + (line + b"\n") * 20_000
    (tmp_path / "d.csv").write_bytes(body)
    rows, malformed = _csv_rows(tmp_path / "d.csv")
    assert not rows and len(malformed) == 20_000
    assert 0 < counting.scanned <= 8 * len(body)  # quadratic scanning would be ~20,000 x the chunk


def test_a_reader_drained_after_each_batch_never_holds_more_than_a_chunk_of_bad_lines(tmp_path, monkeypatch):
    # The malformed lines of a whole file were held until its end: an 8 MiB file of two-byte bad
    # lines took about 1 GB as Python tuples. The reader now pauses (an empty batch) after a chunk
    # of only bad lines, so its caller can take them: counted, not timed or measured.
    monkeypatch.setattr(readers, "_CHUNK_BYTES", 4096)
    bad = b'"\n' * 30_000
    good = b"".join(b"%d,2026-03-01,1\n" % i for i in range(50))
    (tmp_path / "d.csv").write_bytes(b"user_id,day,opened\n" + bad + good + bad)
    malformed = MalformedLines()
    held, taken, rows = [], 0, 0
    for batch in read_batches(tmp_path / "d.csv", malformed=malformed):
        held.append(len(malformed))
        lines = malformed.drain()
        taken += lines.num_rows
        rows += batch.num_rows
        assert len(malformed) == 0
    assert (rows, taken) == (50, 60_000)
    assert max(held) <= 4096 // 2  # one chunk's lines, never the file's


def test_drained_malformed_lines_keep_their_numbers_text_and_reasons_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "_MALFORMED_PART", 3)  # several Arrow parts
    (tmp_path / "d.csv").write_bytes(b"user_id,day,opened\n" + b"".join(b"%d\n" % i for i in range(7))
                                     + b"\xff,x,y\n")
    malformed = MalformedLines()
    assert sum(b.num_rows for b in read_batches(tmp_path / "d.csv", malformed=malformed)) == 0
    lines = malformed.drain()
    assert lines.column("line").to_pylist() == list(range(2, 10))
    assert lines.column("raw").to_pylist() == [str(i) for i in range(7)] + ["\ufffd,x,y"]
    assert lines.column("why").to_pylist() == ["1 fields, not the header's 3"] * 7 + ["not UTF-8 text"]


def test_a_byte_order_mark_starting_a_data_line_is_kept_wherever_the_line_falls(tmp_path):
    # Arrow's CSV parser drops a BOM at the start of its input: a data line that happened to come
    # first in a chunk's plain lines lost its BOM ("\ufeffbob" read as the user "bob"), the same
    # bytes further down did not, so a row's id depended on the lines around it.
    (tmp_path / "d.csv").write_bytes("\ufeffuser_id,day,opened\n\ufeffbob,2026-03-01,1\n"
                                     "\ufeffbob,2026-03-02,1\nx,\"2026-03-01\",1\n\ufeffbob,2026-03-03,1\n"
                                     .encode("utf-8"))
    rows, malformed = _csv_rows(tmp_path / "d.csv")
    assert not malformed
    assert [r["user_id"] for r in rows] == ["\ufeffbob", "\ufeffbob", "x", "\ufeffbob"]
    (tmp_path / "e.csv").write_bytes('user_id,day,opened\nx,"2026-03-01",1\n\ufeffbob,2026-03-02,1\n'.encode("utf-8"))
    rows, _ = _csv_rows(tmp_path / "e.csv")
    assert [r["user_id"] for r in rows] == ["x", "\ufeffbob"]


def test_a_csv_whose_lines_end_in_lone_carriage_returns_is_refused_naming_it(tmp_path):
    # Old Mac line ends: the whole file is one header line with carriage returns inside.
    (tmp_path / "mac.csv").write_bytes(b"user_id,day,opened\r1,2026-03-01,1\r2,2026-03-01,0\r")
    with pytest.raises(InputFileError, match="mac.csv"):
        list(read_batches(tmp_path / "mac.csv", malformed=MalformedLines()))


def test_a_header_line_longer_than_the_header_limit_is_refused_naming_the_file(tmp_path):
    from renyi_stream.stream.engine import readers

    names = ",".join(f"c{i}" for i in range(readers._MAX_HEADER_BYTES // 4))
    (tmp_path / "wide.csv").write_bytes(b"user_id,day," + names.encode() + b"\n1,2026-03-01\n")
    with pytest.raises(InputFileError, match="wide.csv.*header"):
        list(read_batches(tmp_path / "wide.csv", malformed=MalformedLines()))


def _string_id_columns() -> list[pa.Array]:
    ids = ["alice", "7"]
    columns = [pa.array(ids).dictionary_encode(), pa.array(ids, pa.large_string()),
               pa.array(ids, pa.large_string()).dictionary_encode()]
    if hasattr(pa, "string_view"):
        columns.append(pa.array(ids, pa.string_view()))
    return columns


@pytest.mark.parametrize("ids", _string_id_columns(), ids=lambda a: str(a.type))
def test_a_string_id_column_gives_a_new_ledger_string_ids_whatever_its_encoding(tmp_path, ids):
    # A dictionary-encoded id column (a pandas category, a writer's choice) gave an undeclared
    # input int64 ids: "alice" became a wrong_type dead letter, "7" the user 7. (The features job
    # without a contract still takes this rule; a new ledger must declare its id type.)
    from renyi_stream.stream.engine.readers import id_type_of

    table = pa.table({"user_id": ids, "day": ["2026-03-01"] * 2, "opened": [1.0, 0.0]})
    with ipc.new_file(tmp_path / "a.arrow", table.schema) as writer:
        writer.write_table(table)
    assert id_type_of(tmp_path / "a.arrow") == "string"
    # A string_view column goes to Parquet as itself from pyarrow 21 on, as utf8 before (pyarrow 16
    # in the Flink environment cannot write it): stream/arrow_compat.py.
    pq.write_table(parquet_writable(table), tmp_path / "a.parquet")
    assert id_type_of(tmp_path / "a.parquet") == "string"


def test_a_crlf_line_of_exactly_the_limit_is_read_wherever_its_newline_falls(tmp_path, monkeypatch):
    # A line of MAX_LINE_BYTES bytes ended by CRLF, its newline in the next chunk: the reader's
    # partial line held MAX + 1 bytes (the CR counted), so it was "too long" there and read elsewhere.
    from renyi_stream.stream.engine import readers

    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 8)
    header = b"user_id,day\n"
    line = b"abcd,efg\r\n"  # 8 bytes, then CRLF
    monkeypatch.setattr(readers, "_CHUNK_BYTES", len(header) + 9)  # the chunk ends between CR and LF
    (tmp_path / "d.csv").write_bytes(header + line + b"x,y\n")
    assert _csv_rows(tmp_path / "d.csv") == ([{"user_id": "abcd", "day": "efg"}, {"user_id": "x", "day": "y"}], [])


def _reference_csv(body: bytes, limit: int, fields: int) -> tuple[list[tuple[str, ...]], list[int]]:
    """What the reader must give, one line at a time: the rows and the malformed line numbers."""
    import csv

    rows, bad = [], []
    lines = body.split(b"\n")
    for number, line in enumerate(lines[:-1] if body.endswith(b"\n") else lines, start=2):
        line = line[:-1] if line.endswith(b"\r") else line
        if not line:
            continue
        try:
            if len(line) > limit or b"\r" in line:
                raise ValueError(line)
            text = line.decode("utf-8")
            record = next(csv.reader([text], strict=True)) if '"' in text else text.split(",")
        except (ValueError, csv.Error):
            bad.append(number)
            continue
        if len(record) != fields:
            bad.append(number)
            continue
        rows.append(tuple(record))
    return rows, bad


@settings(derandomize=True, database=None, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.sampled_from([b"1", b",", b'"', b"\r", b"\xff", b"\xef\xbb\xbf", b"x", b"\n", b"\n",
                                        b"\xc3\xa9", b"\r\n"]), max_size=200),
       limit=st.integers(4, 14), chunk=st.integers(12, 40))
def test_property_each_csv_line_is_read_as_on_its_own_wherever_the_chunks_fall(tmp_path, monkeypatch, pieces,
                                                                                 limit, chunk):
    from renyi_stream.stream.engine import readers

    monkeypatch.setattr(readers, "MAX_LINE_BYTES", limit)
    monkeypatch.setattr(readers, "_CHUNK_BYTES", chunk)
    body = b"".join(pieces)
    (tmp_path / "p.csv").write_bytes(b"user_id,day\n" + body)
    rows, malformed = _csv_rows(tmp_path / "p.csv")
    assert ([tuple(r.values()) for r in rows], sorted(line for line, _, _ in malformed)) == \
        _reference_csv(body, limit, 2)
