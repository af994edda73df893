"""The row balance: every row read reached exactly one outcome, checked and recorded the same way
by every job.

Invariant 7 (rows-counted-not-lost, docs/architecture.md): a run's rows are admitted, clipped or
dropped by the filter, or dead-lettered with a reason (:class:`renyi_stream.stream.schema.DeadLetterReason`),
``late_window`` counted apart as ``late`` and every other reason as ``rejected``, and

    rows_read = admitted + clipped + dropped + rejected + late

holds for every run. :class:`RowBalance` is that record: the daily job's ``JobSummary`` (and the
curator's ``run_counts`` row), the distributed job's manifest ``totals`` and ``balanced``, and the
streaming job's ``_BOOKS.json`` are all built by :meth:`RowBalance.of` and written with
:meth:`RowBalance.totals`, so the three jobs record the same field names with the same meaning.

The counts are exact: curator only (invariant 4 (nothing-pre-noise-leaves, docs/architecture.md)).
Beam-free and storage-free: the jobs pass plain counts in.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.ledger import STATUS_NAMES
from renyi_stream.stream.schema import DeadLetterReason

__all__ = ["RowBalance", "reason_counts"]

_REASONS = frozenset(reason.value for reason in DeadLetterReason)


@dataclass(frozen=True)
class RowBalance:
    """Where a run's rows went (counts of rows, exact, curator only).

    ``rows_read``: every row read (a streaming message that does not decode counts as one row,
    its one dead letter); ``admitted``, ``clipped``, ``dropped``: rows the filter charged by
    outcome (:data:`renyi_stream.stream.ledger.STATUS_NAMES`); ``rejected``: rows dead-lettered for any reason
    but ``late_window``; ``late``: rows dead-lettered ``late_window`` (their window was charged
    before). Build it with :meth:`of`."""

    rows_read: int
    admitted: int
    clipped: int
    dropped: int
    rejected: int
    late: int

    def __post_init__(self) -> None:
        for f in fields(RowBalance):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{f.name} must be a count (an int >= 0), got {f.name}={value!r}")

    @classmethod
    def of(cls, *, rows_read: int, statuses: Mapping[str, int], reasons: Mapping[str, int]) -> "RowBalance":
        """The balance of a run that read ``rows_read`` rows, charged ``statuses`` (rows per
        filter outcome, names from :data:`renyi_stream.stream.ledger.STATUS_NAMES`, absent ones 0) and
        dead-lettered ``reasons`` (rows per :class:`renyi_stream.stream.schema.DeadLetterReason` value).
        ValueError naming the key for a status or reason outside its vocabulary, or a count that
        is not an int >= 0."""
        unknown = sorted(set(statuses) - set(STATUS_NAMES))
        if unknown:
            raise ValueError(f"statuses must be among {list(STATUS_NAMES)}, got {unknown[0]!r}")
        unknown = sorted(set(reasons) - _REASONS)
        if unknown:
            raise ValueError(f"reasons must be DeadLetterReason values {sorted(_REASONS)}, got {unknown[0]!r}")
        counts = {**{f"status {k!r}": v for k, v in statuses.items()},
                  **{f"reason {k!r}": v for k, v in reasons.items()}}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"the count of {name} must be an int >= 0, got {value!r}")
        late = int(reasons.get(DeadLetterReason.LATE_WINDOW.value, 0))
        return cls(rows_read=int(rows_read), admitted=int(statuses.get("admitted", 0)),
                   clipped=int(statuses.get("clipped", 0)), dropped=int(statuses.get("dropped", 0)),
                   rejected=int(sum(reasons.values())) - late, late=late)

    @property
    def balanced(self) -> bool:
        """Whether every row read reached exactly one outcome (invariant 7)."""
        return self.rows_read == self.admitted + self.clipped + self.dropped + self.rejected + self.late

    def totals(self) -> dict[str, int]:
        """The counts as every job records them: ``rows_read``, ``admitted``, ``clipped``,
        ``dropped``, ``rejected``, ``late`` (with :attr:`balanced` beside them where a record
        has it)."""
        return {f.name: getattr(self, f.name) for f in fields(RowBalance)}


def reason_counts(tables: Iterable[pa.Table]) -> dict[str, int]:
    """Rows per dead-letter reason over dead-letter tables (a ``reason`` column, as
    :data:`renyi_stream.stream.engine.dead_letters.DEAD_LETTER_SCHEMA`), counted by Arrow, not row by row."""
    totals: dict[str, int] = {}
    for table in tables:
        if not table.num_rows:
            continue
        for item in pc.value_counts(table.column("reason").combine_chunks()).to_pylist():
            totals[str(item["values"])] = totals.get(str(item["values"]), 0) + int(item["counts"])
    return dict(sorted(totals.items()))
