"""Which days each input file holds, and whether every window a run releases is covered by one:
the structural rule that decides whether a batch run is refused (issue 37).

A run is refused, or not, on its arguments, its files' names and the schedule alone: never on
whether any one row is present or valid (docs/architecture.md, "The input contract"). The
rule it replaces refused a run none of whose rows a window to release could use, so whether a
day went out could be one user's bit (their one row made the run "not idle").

* A file **names its day** when its path does: a hive-style folder ``day=YYYY-MM-DD`` (or
  ``date=``, ``dt=``) or one ISO date ``YYYY-MM-DD`` in the file's own name
  (``events-2026-03-01.csv``). A file naming two different days is refused (which is it?).
* The files that name no day hold the days the operator declares for them (``--input-days
  FIRST[:LAST]``); without that declaration they are taken to hold the run's schedule
  (``--start..--end``), and the run says so: name files by day to have a wrong file refused.
* A window is **covered** by a file whose days overlap it, or by a day the operator declares to
  have no file (``--no-data-days``: its release is noise only, on purpose). A run with a window
  to release that nothing covers is refused before anyone is charged: another day's file, an
  ``--end`` past the last file, or a range re-run given only the charged day's file.
* A row whose window is outside its file's days is a dead letter ``outside_file_days``
  (:func:`renyi_stream.stream.engine.dead_letters.classify_windows`): a file's name is believed
  over its rows, so a stray row never charges a day its file does not name.

Beam-free and storage-free: the daily and distributed jobs call it at launch.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Iterable, Mapping, Sequence

from renyi_stream.stream.schema import WindowSpec

__all__ = ["CoverageError", "DayRange", "FileDays", "days_of_files", "file_day", "format_windows",
           "parse_day_ranges", "refuse_uncovered_windows", "window_date"]

_SECONDS_PER_DAY = 86_400
# A date not run into other digits: 2026-03-01 in "day-2026-03-01.csv", not in "12026-03-011".
_DATE = re.compile(r"(?<![0-9])([0-9]{4}-[0-9]{2}-[0-9]{2})(?![0-9])")
_HIVE_DAY = re.compile(r"^(?:day|date|dt)=([0-9]{4}-[0-9]{2}-[0-9]{2})$")


class CoverageError(ValueError):
    """A run refused on its structure: a window to release no input covers, or a file whose name
    names two days. The message names the files, windows and dates, never a count of rows."""


@dataclass(frozen=True)
class DayRange:
    """The days ``first..last`` (inclusive, UTC dates)."""

    first: dt.date
    last: dt.date

    def __post_init__(self) -> None:
        if self.last < self.first:
            raise ValueError(f"a day range must not end before it starts, got {self.first}:{self.last}")

    def windows(self, spec: WindowSpec) -> tuple[int, int]:
        """The first and last window of ``spec`` that overlap these days (a window of any length
        overlapping any second of them)."""
        start = _day_seconds(self.first)
        end = _day_seconds(self.last) + _SECONDS_PER_DAY - 1
        return int(spec.window_of_seconds(start)), int(spec.window_of_seconds(end))

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}..{self.last}"


@dataclass(frozen=True)
class FileDays:
    """The days each input holds: ``inputs`` in the run's order, ``named`` maps a file to the day
    its path names; ``declared`` is the range the files naming no day hold (``--input-days``,
    else the schedule's days; ``declared_by_operator`` says which), or None when every file
    names its day."""

    inputs: tuple[str, ...]
    named: Mapping[str, dt.date]
    declared: DayRange | None
    declared_by_operator: bool

    def window_range(self, path: str, spec: WindowSpec) -> tuple[int, int] | None:
        """The windows the rows of ``path`` may be of (those overlapping its days), or None when
        nobody named its days: a file naming no day, without ``--input-days``, is taken as
        holding the schedule, whose rule (``out_of_range_time``) then applies to its rows."""
        day = self.named.get(path)
        if day is not None:
            return DayRange(day, day).windows(spec)
        if path not in self.inputs:
            raise KeyError(f"no days are known for input {path}")
        return self.declared.windows(spec) if self.declared_by_operator else None

    def undated(self) -> list[str]:
        """The inputs whose path names no day, in the run's order."""
        return [p for p in self.inputs if p not in self.named]


def file_day(path: str) -> dt.date | None:
    """The day ``path`` names (module docstring), or None when it names none. CoverageError when
    it names two different days or a date that does not exist (``2026-02-30``)."""
    parts = PurePosixPath(str(path).replace("\\", "/")).parts
    found: set[str] = set()
    for part in parts[:-1]:
        match = _HIVE_DAY.match(part)
        if match:
            found.add(match.group(1))
    found.update(_DATE.findall(parts[-1]) if parts else [])
    if not found:
        return None
    if len(found) > 1:
        raise CoverageError(f"input {path} names the days {', '.join(sorted(found))}: a file holds one day's rows, "
                            "or names no day and gets --input-days FIRST:LAST")
    text = found.pop()
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise CoverageError(f"input {path} names the day {text}, which is not a date") from None


def days_of_files(paths: Sequence[str], *, spec: WindowSpec, start_window: int, end_window: int,
                  input_days: DayRange | None = None) -> FileDays:
    """The days of every input (module docstring). ``input_days`` declares the days of the
    files that name none; without it they hold the schedule's days (``start_window`` ..
    ``end_window``). ValueError naming ``--input-days`` when it is given but every file names
    its day (it would declare nothing)."""
    named = {}
    for path in paths:
        day = file_day(path)
        if day is not None:
            named[str(path)] = day
    undated = [str(p) for p in paths if str(p) not in named]
    if input_days is not None and not undated:
        raise ValueError(f"--input-days {input_days} declares the days of files that name none, but every input "
                         "names its day in its path: leave --input-days out")
    declared = input_days
    if undated and declared is None:
        declared = DayRange(window_date(start_window, spec), window_date(end_window, spec))
    return FileDays(inputs=tuple(str(p) for p in paths), named=named, declared=declared if undated else None,
                    declared_by_operator=input_days is not None)


def refuse_uncovered_windows(days: FileDays, to_release: Iterable[int], *, spec: WindowSpec,
                             no_data: Sequence[DayRange] = ()) -> None:
    """CoverageError, before anyone is charged, when a window of ``to_release`` overlaps no
    input's days and no day of ``no_data`` (days the operator says have no file). The message
    names the first uncovered windows with their dates and the files' days."""
    ranges = [DayRange(day, day).windows(spec) for day in days.named.values()]
    if days.declared is not None:
        ranges.append(days.declared.windows(spec))
    ranges += [r.windows(spec) for r in no_data]
    missing = [w for w in sorted(set(int(w) for w in to_release))
               if not any(low <= w <= high for low, high in ranges)]
    if not missing:
        return
    named = sorted(set(days.named.values()))
    held = ", ".join(str(d) for d in named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    if days.declared is not None:
        held = (held + "; " if held else "") + f"{days.declared} (the files naming no day)"
    raise CoverageError(
        f"no input holds {format_windows(missing, spec)}, which this run would release: the inputs hold "
        f"{held or 'no day'}. Refusing the run before anyone is charged or anything is published: a window "
        "released without its day's file is noise for good. Check --start/--end against the files, give that "
        "day's file (named by its day: day=YYYY-MM-DD/ or a date in its name), or, for a day that truly has no "
        "data, --no-data-days DAY")


def parse_day_ranges(option: str, text: str) -> list[DayRange]:
    """``FIRST[:LAST]`` ranges, comma-separated (``2026-03-01``, ``2026-03-01:2026-03-07``), as
    the command lines' ``--input-days`` and ``--no-data-days`` write them; ValueError naming
    ``option`` and the value otherwise."""
    ranges = []
    for item in str(text).split(","):
        first, _, last = item.strip().partition(":")
        try:
            ranges.append(DayRange(dt.date.fromisoformat(first), dt.date.fromisoformat(last or first)))
        except ValueError as exc:
            raise ValueError(f"{option} must be days YYYY-MM-DD or ranges YYYY-MM-DD:YYYY-MM-DD, comma-separated, "
                             f"got {option} {text!r} ({exc})") from None
    return ranges


def window_date(window: int, spec: WindowSpec) -> dt.date:
    """The UTC date on which ``window`` starts."""
    return dt.datetime.fromtimestamp(int(spec.window_start_seconds(int(window))), tz=dt.timezone.utc).date()


def format_windows(windows: Sequence[int], spec: WindowSpec, *, limit: int = 5) -> str:
    """``window 20513 (2026-03-01)``, several as ``windows 20513 (2026-03-01), ...``: every
    message that names a window names its date beside it."""
    shown = [f"{int(w)} ({window_date(w, spec)})" for w in list(windows)[:limit]]
    more = f" and {len(windows) - limit} more" if len(windows) > limit else ""
    return ("window " if len(windows) == 1 else "windows ") + ", ".join(shown) + more


def _day_seconds(day: dt.date) -> int:
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp())
