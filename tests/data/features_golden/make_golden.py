"""The features stage's golden fixture: small daily indicator files and the features Parquet the
stage must write from them.

``python tests/data/features_golden/make_golden.py`` rewrites the inputs (deterministic: fixed
seed) under ``inputs/``. The golden outputs (``int_ids.parquet``, ``string_ids.parquet`` and
``summary.json``) were made with ``--golden`` by the DuckDB implementation of
``renyi-stream features`` (``renyi_stream.pipelines.curator.features.materialise_features`` as of commit
8b2d674, in commit 7821dfe), before the stage became a Beam job. That implementation is gone:
``--golden`` now runs the Beam job, so a regenerated golden proves nothing about the old code;
keep the committed one. ``summary.json``'s ``rows_rejected`` is the old stage's count, which left
out each repeat of a (user, day) from a later file (the Beam job counts them, as the daily job
does).

The inputs cover, over a feature window 2026-03-01..04, a gap day (03-05) and a label window
03-06..07:

* ``int_a.parquet`` (int64 ids, ``day`` as date32; days 03-01..03): a repeated (user, day) inside
  the file (the first kept), a NaN, a null id, a row on 02-27 (outside both windows);
* ``int_b.csv`` (ids read as int64; days 03-03..05): a day that ``int_a`` also has for some users
  (a repeated (user, day) across files: the earlier file's row is kept), a line with too many
  fields (malformed), a value that is not a number, the gap day;
* ``int_c.parquet`` (``event_time`` timestamps; days 03-06..07 and one row on 03-10, outside);
* ``str_a.parquet`` and ``str_b.csv``: the same with text ids, an empty id among them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
INPUTS = HERE / "inputs"
DAY0 = dt.date(2026, 3, 1)
#: The stage's arguments for both goldens.
WINDOWS = {"start": "2026-03-01", "end": "2026-03-04", "label_column": "bought",
           "label_start": "2026-03-06", "label_end": "2026-03-07"}
INT_INPUTS = ("int_a.parquet", "int_b.csv", "int_c.parquet")
STRING_INPUTS = ("str_a.parquet", "str_b.csv")
USERS = 300


def _day(offset: int) -> dt.date:
    return DAY0 + dt.timedelta(days=offset)


def _rows(rng: np.random.Generator, days: range) -> dict[str, list]:
    """Users with a propensity: ``opened`` and ``bought`` 0/1 floats, ``minutes`` small integers."""
    propensity = np.linspace(0.05, 0.95, USERS)
    out: dict[str, list] = {"user": [], "day": [], "opened": [], "bought": [], "minutes": []}
    for d in days:
        opened = rng.random(USERS) < propensity
        bought = rng.random(USERS) < 0.5 * propensity ** 2
        present = np.flatnonzero(opened | bought | (rng.random(USERS) < 0.1))
        out["user"] += present.tolist()
        out["day"] += [d] * present.size
        out["opened"] += opened[present].astype(float).tolist()
        out["bought"] += bought[present].astype(float).tolist()
        out["minutes"] += rng.integers(0, 40, size=present.size).tolist()
    return out


def _int_a(rng: np.random.Generator) -> pa.Table:
    r = _rows(rng, range(0, 3))
    again = r["user"][0]  # present on day 0: its second row there is a repeat
    users, days = r["user"] + [again, None, 7, 8], [_day(d) for d in r["day"]] + [_day(0), _day(1), _day(-2), _day(2)]
    opened = r["opened"] + [9.0, 1.0, 1.0, float("nan")]
    bought = r["bought"] + [9.0, 1.0, 1.0, 0.0]
    minutes = r["minutes"] + [99, 1, 1, 1]
    return pa.table({"user_id": pa.array(users, type=pa.int64()), "day": pa.array(days, type=pa.date32()),
                     "opened": pa.array(opened), "bought": pa.array(bought),
                     "minutes": pa.array(minutes, type=pa.int64())})


def _csv(path: Path, rng: np.random.Generator, ids, days: range, extra: list[str]) -> None:
    r = _rows(rng, days)
    lines = ["user_id,day,opened,bought,minutes"]
    lines += [f"{ids(u)},{_day(d).isoformat()},{o:g},{b:g},{m}"
              for u, d, o, b, m in zip(r["user"], r["day"], r["opened"], r["bought"], r["minutes"])]
    lines += extra
    path.write_text("\n".join(lines) + "\n")


def _int_c(rng: np.random.Generator) -> pa.Table:
    r = _rows(rng, range(5, 7))
    seconds = [(_day(d) - dt.date(1970, 1, 1)).days * 86400 + 3600 * (u % 24) for u, d in zip(r["user"], r["day"])]
    seconds.append((_day(9) - dt.date(1970, 1, 1)).days * 86400)
    return pa.table({"user_id": pa.array(r["user"] + [3], type=pa.int64()),
                     "event_time": pa.array(seconds, type=pa.int64()).cast(pa.timestamp("s", tz="UTC")),
                     "opened": pa.array(r["opened"] + [1.0]), "bought": pa.array(r["bought"] + [1.0]),
                     "minutes": pa.array(r["minutes"] + [1], type=pa.int64())})


def _str_a(rng: np.random.Generator) -> pa.Table:
    r = _rows(rng, range(0, 4))
    ids = [f"u{u:04d}" for u in r["user"]] + ["", f"u{r['user'][0]:04d}", "u0009"]
    days = [_day(d) for d in r["day"]] + [_day(0), _day(0), _day(-1)]
    return pa.table({"user_id": pa.array(ids), "day": pa.array(days, type=pa.date32()),
                     "opened": pa.array(r["opened"] + [1.0, 9.0, 1.0]),
                     "bought": pa.array(r["bought"] + [1.0, 9.0, 1.0]),
                     "minutes": pa.array(r["minutes"] + [1, 99, 1], type=pa.int64())})


def write_inputs(folder: Path = INPUTS) -> None:
    """Write the fixture's input files into ``folder`` (deterministic)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261124)
    pq.write_table(_int_a(rng), folder / "int_a.parquet")
    _csv(folder / "int_b.csv", rng, str, range(2, 5), ["11,2026-03-03,1,0,3,extra", "12,2026-03-04,x,0,1"])
    pq.write_table(_int_c(rng), folder / "int_c.parquet")
    pq.write_table(_str_a(rng), folder / "str_a.parquet")
    _csv(folder / "str_b.csv", rng, lambda u: f"u{u:04d}", range(3, 7), ["u0011,2026-03-03,1,0", ",2026-03-04,1,1,1"])


def write_golden(folder: Path = HERE) -> None:
    """Run the stage on the inputs and write its outputs as the golden files (see the docstring)."""
    from renyi_stream.pipelines.features.job import materialise_features

    summary = {}
    for name, inputs in (("int_ids", INT_INPUTS), ("string_ids", STRING_INPUTS)):
        result = materialise_features([str(INPUTS / f) for f in inputs], folder / f"{name}.parquet", **WINDOWS)
        summary[name] = {"users": result.users, "positives": result.positives, "rows_read": result.rows_read,
                         "rows_rejected": result.rows_rejected}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--golden", action="store_true", help="also rewrite the golden outputs (see the docstring)")
    args = parser.parse_args()
    write_inputs()
    if args.golden:
        write_golden()
