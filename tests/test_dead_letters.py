"""Dead letters have one vocabulary and one builder (issue 19, item 1): every reason is spelled
once, in :class:`stream.schema.DeadLetterReason`, and every job writes its dead letters through
:func:`stream.engine.dead_letters.dead_letters`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pyarrow as pa
import pytest

from stream.engine.dead_letters import DEAD_LETTER_SCHEMA, dead_letters
from stream.schema import DeadLetterReason

ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = {reason.value for reason in DeadLetterReason}


def _statement_strings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own (docstrings): prose that
    may name a reason, never a value the code compares or writes."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _vocabulary_members(tree: ast.AST) -> set[int]:
    """ids of the constants inside ``class DeadLetterReason``: the one place reasons are spelled."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "DeadLetterReason"
            for inner in ast.walk(node)}


def _reason_literals(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _statement_strings(tree) | _vocabulary_members(tree)
    quoted = re.compile(r"""['"](%s)['"]""" % "|".join(sorted(VOCABULARY)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            # The reason itself, or quoted inside a longer string (an SQL literal).
            if node.value in VOCABULARY or quoted.search(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_dead_letter_reason_is_spelled_outside_its_vocabulary():
    files = sorted(p for folder in ("pipelines", "stream") for p in (ROOT / folder).rglob("*.py"))
    found = [hit for path in files for hit in _reason_literals(path)]
    assert found == [], "use stream.schema.DeadLetterReason instead of spelling a reason: " + "; ".join(found)


def test_the_scan_finds_a_reason_spelled_in_code_and_in_sql(tmp_path):
    # The rule above must be able to fail: a reason compared in code or inside SQL is found.
    path = tmp_path / "probe.py"
    path.write_text('"""Docs may say late_window."""\n'
                    'LATE = "late_window"\n'
                    'SQL = "SELECT count(*) FROM dead_letters WHERE reason = \'malformed_row\'"\n')
    assert [hit.split(": ", 1)[0] for hit in _reason_literals(path, tmp_path)] == ["probe.py:2", "probe.py:3"]


def test_every_reason_is_documented_with_its_meaning_and_where_it_comes_from():
    import stream.engine.dead_letters as engine

    for reason in DeadLetterReason:
        assert f"``{reason.value}``" in DeadLetterReason.__doc__, reason
        assert f"``{reason.value}``" in engine.__doc__, reason


def test_the_reason_values_are_the_words_stored_dead_letters_already_hold():
    assert sorted(VOCABULARY) == sorted([
        "null_user_id", "empty_user_id", "null_time", "bad_time", "null_value", "wrong_type", "non_finite_value",
        "out_of_range_time", "duplicate_user_window", "malformed_row", "late_window", "undecodable_message"])


def test_the_builder_broadcasts_single_values_over_the_rows_it_is_given():
    table = dead_letters(DeadLetterReason.MALFORMED_ROW, source="day.csv", row_index=-1,
                         detail=["line 3", "line 7"], raw=["a,b,c", "d"])
    assert table.schema == DEAD_LETTER_SCHEMA
    assert table.to_pylist() == [
        {"source": "day.csv", "row_index": -1, "reason": "malformed_row", "detail": "line 3", "raw": "a,b,c"},
        {"source": "day.csv", "row_index": -1, "reason": "malformed_row", "detail": "line 7", "raw": "d"}]


def test_the_builder_writes_one_row_when_every_value_is_single():
    table = dead_letters(DeadLetterReason.UNDECODABLE_MESSAGE, source="topic/0/4", row_index=-1,
                         detail="not an Arrow IPC stream", raw="6e6f")
    assert table.column("reason").to_pylist() == ["undecodable_message"] and table.num_rows == 1


def test_the_builder_writes_integer_sources_as_text():
    table = dead_letters(DeadLetterReason.DUPLICATE, source=pa.array([0, 2], type=pa.int64()),
                         row_index=pa.array([5, 1], type=pa.int64()), detail="came second", raw=["{}", "{}"])
    assert table.column("source").to_pylist() == ["0", "2"]


@pytest.mark.parametrize("reason", ["late_window", pa.array(["late_window", "late"]), pa.array([None], pa.string())])
def test_the_builder_refuses_a_reason_outside_the_vocabulary_or_spelled_as_a_plain_string(reason):
    with pytest.raises(ValueError, match="reason"):
        dead_letters(reason, source="f", row_index=0, detail="d", raw="r")


def test_the_builder_refuses_columns_of_different_lengths():
    with pytest.raises(ValueError, match="lengths"):
        dead_letters(DeadLetterReason.LATE_WINDOW, source="f", row_index=[1, 2], detail=["a"], raw="r")
