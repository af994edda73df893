"""The inputs' days (renyi_stream.stream.engine.input_days): which day a file's path names, which
windows its rows may be of, and the structural refusal of a run with a window no input covers.
The jobs' side (a refusal through ``renyi-stream run`` and the distributed job, the same for two
inputs one user's row apart) is in tests/test_broken_files.py."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from renyi_stream.stream.engine.dead_letters import classify_windows
from renyi_stream.stream.engine.input_days import (CoverageError, DayRange, days_of_files, file_day, format_windows,
                                                   parse_day_ranges, refuse_uncovered_windows)
from renyi_stream.stream.schema import WindowSpec

DAILY = WindowSpec()
HOURLY = WindowSpec.from_length("1h")
D1 = dt.date(2026, 3, 1)
W1 = (D1 - dt.date(1970, 1, 1)).days


@pytest.mark.parametrize("path", ["/data/day=2026-03-01/part-0.parquet", "/data/date=2026-03-01/part-0.parquet",
                                  "s3://b/events/dt=2026-03-01/x.csv", "/in/events-2026-03-01.csv",
                                  "/in/2026-03-01.parquet", "/in/2026-03-01/day=2026-03-01/2026-03-01_a.parquet"])
def test_a_path_names_its_day_in_a_hive_folder_or_in_the_files_own_name(path):
    assert file_day(path) == D1


@pytest.mark.parametrize("path", ["/in/day1.parquet", "/in/export.csv", "/2026-03-01/export.csv",
                                  "/in/events-20260301.csv", "/in/v12026-03-011.csv"])
def test_a_path_without_a_hive_day_or_a_date_in_its_name_names_no_day(path):
    # A date in an ordinary folder (an export folder's name) is not believed: only the file's own
    # name or a day=/date=/dt= partition say what a file holds.
    assert file_day(path) is None


def test_a_path_naming_two_days_is_refused_naming_both():
    with pytest.raises(CoverageError, match="names the days 2026-03-01, 2026-03-07"):
        file_day("/in/events-2026-03-01_to_2026-03-07.csv")


def test_a_path_naming_a_date_that_does_not_exist_is_refused():
    with pytest.raises(CoverageError, match="2026-02-30, which is not a date"):
        file_day("/in/day-2026-02-30.csv")


def test_a_dated_files_rows_may_be_of_the_windows_of_its_day_only():
    days = days_of_files(["/in/day-2026-03-01.csv"], spec=DAILY, start_window=W1, end_window=W1 + 1)
    assert days.window_range("/in/day-2026-03-01.csv", DAILY) == (W1, W1)
    hours = days_of_files(["/in/day-2026-03-01.csv"], spec=HOURLY, start_window=W1 * 24, end_window=W1 * 24 + 23)
    assert hours.window_range("/in/day-2026-03-01.csv", HOURLY) == (W1 * 24, W1 * 24 + 23)


def test_undated_files_are_checked_only_against_days_the_operator_declares():
    taken = days_of_files(["/in/export.csv"], spec=DAILY, start_window=W1, end_window=W1 + 2)
    assert taken.declared == DayRange(D1, D1 + dt.timedelta(days=2)) and not taken.declared_by_operator
    assert taken.window_range("/in/export.csv", DAILY) is None  # the schedule's own rule applies
    declared = days_of_files(["/in/export.csv"], spec=DAILY, start_window=W1, end_window=W1 + 2,
                             input_days=DayRange(D1, D1 + dt.timedelta(days=1)))
    assert declared.window_range("/in/export.csv", DAILY) == (W1, W1 + 1)


def test_input_days_with_every_file_dated_is_refused_as_declaring_nothing():
    with pytest.raises(ValueError, match="--input-days 2026-03-01 declares the days of files that name none"):
        days_of_files(["/in/day-2026-03-01.csv"], spec=DAILY, start_window=W1, end_window=W1,
                      input_days=DayRange(D1, D1))


def test_every_window_to_release_covered_passes_and_the_first_uncovered_is_named_with_its_date():
    days = days_of_files(["/a/day-2026-03-01.csv", "/a/day-2026-03-03.csv"], spec=DAILY, start_window=W1,
                         end_window=W1 + 2)
    refuse_uncovered_windows(days, [W1, W1 + 2], spec=DAILY)
    with pytest.raises(CoverageError, match=r"no input holds window 20514 \(2026-03-02\), which this run would "
                                            r"release: the inputs hold 2026-03-01, 2026-03-03\."):
        refuse_uncovered_windows(days, [W1, W1 + 1, W1 + 2], spec=DAILY)
    refuse_uncovered_windows(days, [W1 + 1], spec=DAILY, no_data=[DayRange(D1 + dt.timedelta(days=1),
                                                                           D1 + dt.timedelta(days=1))])


def test_a_week_window_is_covered_by_a_file_of_any_of_its_days():
    weekly = WindowSpec.from_length("7d")
    days = days_of_files(["/a/day-2026-03-03.csv"], spec=weekly, start_window=0, end_window=10_000)
    week = int(weekly.window_of_day("day", "2026-03-03"))
    refuse_uncovered_windows(days, [week], spec=weekly)
    with pytest.raises(CoverageError):
        refuse_uncovered_windows(days, [week + 1], spec=weekly)


def test_the_refusal_depends_on_the_files_names_and_the_schedule_only():
    # The decision's inputs are paths, windows and declared days: no row reaches it.
    import inspect

    assert list(inspect.signature(refuse_uncovered_windows).parameters) == ["days", "to_release", "spec", "no_data"]


def test_day_ranges_parse_as_the_command_lines_write_them_and_errors_name_the_option():
    assert parse_day_ranges("--no-data-days", "2026-03-01, 2026-03-03:2026-03-04") == [
        DayRange(D1, D1), DayRange(D1 + dt.timedelta(days=2), D1 + dt.timedelta(days=3))]
    with pytest.raises(ValueError, match="--no-data-days must be days YYYY-MM-DD .* got --no-data-days '03/01'"):
        parse_day_ranges("--no-data-days", "03/01")
    with pytest.raises(ValueError, match="must not end before it starts"):
        parse_day_ranges("--input-days", "2026-03-02:2026-03-01")


def test_windows_are_named_with_their_dates():
    assert format_windows([W1], DAILY) == "window 20513 (2026-03-01)"
    assert format_windows(list(range(W1, W1 + 7)), DAILY, limit=2) == \
        "windows 20513 (2026-03-01), 20514 (2026-03-02) and 5 more"


def test_a_row_outside_its_files_days_is_neither_late_nor_out_of_schedule_but_outside_its_file():
    windows = np.array([W1 - 1, W1, W1 + 1, W1 + 5], dtype=np.int64)
    classes = classify_windows(windows, start_window=W1, end_window=W1 + 1, charged=[W1 - 1],
                               file_windows=(W1, W1))
    assert classes.outside_file.tolist() == [True, False, True, True]
    assert classes.late.tolist() == [False] * 4 and classes.out_of_schedule.tolist() == [False] * 4
    assert classes.keep.tolist() == [False, True, False, False]
    assert [reason.value for reason, _ in classes.reasons()] == ["outside_file_days"]
