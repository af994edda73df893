"""The streaming individual filter (renyi_stream.pipelines.streaming.beam.releases) under Beam's TestStream, on the
DirectRunner in streaming mode, with explicit watermark advances: one test per behaviour, each
checked against the batch path (renyi_stream.pipelines.beam.transforms.DailyReleases) on the same files."""

from __future__ import annotations

import datetime as dt
import pickle
import uuid
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.coders import PickleCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline as beam_test_pipeline
from apache_beam.testing import test_stream as beam_test_stream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP

from renyi_stream.pipelines.beam import transforms as tx
from renyi_stream.stream.engine.shard_state import QueryPlan
from renyi_stream.pipelines.streaming.beam.releases import (ROW_BAG_PARAMS, ReleaseCompletedWindow,
                                                            StreamingIndividualFilterDoFn, StreamingReleases)
from renyi_stream.queries.linear import default_queries
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise
from renyi_stream.stream.schema import WindowSpec

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
SPEC = WindowSpec()
COLUMNS = ["opened", "bought"]
LEDGER = "0123456789abcdef0123456789abcdef"  # the ledger the graphs under test release for


def _start(w: int) -> int:
    return int(SPEC.window_start_seconds(w))


def _end(w: int) -> int:
    return int(SPEC.window_end_seconds(w))


def _write_day(path, day_offset, users, opened, bought) -> str:
    pq.write_table(pa.table({
        "user_id": pa.array(users, type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=day_offset)] * len(users), type=pa.date32()),
        "opened": pa.array(opened, type=pa.float64()),
        "bought": pa.array(bought, type=pa.float64()),
    }), path)
    return str(path)


def _random_days(tmp_path, n_days, n_users=40, seed=0) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []
    for day in range(n_days):
        users = np.flatnonzero(rng.random(n_users) < 0.7)
        paths.append(_write_day(tmp_path / f"d{day}.parquet", day, users,
                                (rng.random(users.size) < 0.6).astype(float), rng.random(users.size).round(2)))
    return paths


def _params(tmp_path, *, end=2, budget=1.0, policy="drop", n_shards=3) -> dict:
    key_path = str(tmp_path / "noise.key")
    key = NoiseKey.load_or_create(key_path)
    return dict(window=SPEC, start_window=W0, end_window=W0 + end,
                plan=QueryPlan.starting_at(default_queries(COLUMNS), W0), indicator_columns=COLUMNS,
                noise_std=2.0, policy=policy, budget=budget, id_type="int64", tracker_step=1 / 32,
                n_shards=n_shards, key_path=key_path, accounting="gdp", key_fingerprint=key.fingerprint,
                ledger_id=LEDGER)


class _Collect(beam.DoFn):
    """Writes each element and its timestamp to its own file: the runner may pickle DoFns, so
    module globals are not a safe channel back to the test."""

    def __init__(self, folder: str) -> None:
        self._folder = folder

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        Path(self._folder).mkdir(parents=True, exist_ok=True)
        (Path(self._folder) / f"{uuid.uuid4().hex}.pkl").write_bytes(pickle.dumps((element, timestamp)))


def _collected(folder) -> list:
    return [pickle.loads(p.read_bytes()) for p in sorted(Path(folder).glob("*.pkl"))]


def _collect(outputs: dict, root: Path, names) -> dict:
    for name in names:
        _ = outputs[name] | f"Collect_{name}" >> beam.ParDo(_Collect(str(root / name)))
    return {name: root / name for name in names}


def _batch(tmp_path, files, params, name="batch") -> dict:
    root = tmp_path / name
    with beam_test_pipeline.TestPipeline() as p:
        graph = p | tx.DailyReleases(
            files, window=SPEC, start_window=params["start_window"], end_window=params["end_window"], released=[],
            schedule=list(range(params["start_window"], params["end_window"] + 1)), plan=params["plan"],
            indicator_columns=COLUMNS, noise_std=params["noise_std"], policy=params["policy"],
            budget=params["budget"], id_type="int64", tracker_step=params["tracker_step"],
            n_shards=params["n_shards"], previous_ledger=Ledger(budget=params["budget"]).to_arrow().slice(0, 0),
            key_path=params["key_path"], accounting="gdp", key_fingerprint=params["key_fingerprint"],
            ledger_id=params["ledger_id"])
        folders = _collect(graph, root, ["releases", "ledger", "counts", "dead"])
    return {
        "releases": _release_values([r for r, _ in _collected(folders["releases"])]),
        "ledger": _ledger_values([t for t, _ in _collected(folders["ledger"])]),
        "counts": _counts([c for c, _ in _collected(folders["counts"])]),
        "dead": _dead([t for t, _ in _collected(folders["dead"])]),
    }


def _validated(files) -> list[pa.Table]:
    """The valid tables the batch path's reader makes of ``files`` (same input positions)."""
    read = tx.ReadAndValidate(window=SPEC, start_window=W0, end_window=W0 + 100, released=[],
                              indicator_columns=COLUMNS)
    return [out for i, path in enumerate(files) for out in read.process((i, path))
            if not isinstance(out, beam.pvalue.TaggedOutput)]


def _stream(tmp_path, events, params, name="stream") -> dict:
    """Run :class:`StreamingReleases` on ``events``: ``("rows", table, event time)`` or
    ``("watermark", time)``, in that order, then the watermark goes to infinity."""
    stream = beam_test_stream.TestStream(coder=PickleCoder())
    for event in events:
        if event[0] == "rows":
            stream = stream.add_elements([TimestampedValue(event[1], event[2])])
        else:
            stream = stream.advance_watermark_to(event[1])
    stream = stream.advance_watermark_to_infinity()
    root = tmp_path / name
    with beam_test_pipeline.TestPipeline(options=PipelineOptions(["--streaming"])) as p:
        graph = p | stream | StreamingReleases(**params)
        folders = _collect(graph, root, ["releases", "ledger", "counts", "dead"])
    releases = _collected(folders["releases"])
    return {
        "releases": _release_values([r for r, _ in releases]),
        "release_times": {r["window_id"]: int(ts.micros // 1_000_000) for r, ts in releases},
        "ledger": _ledger_values([t for (_, _, t), _ in _collected(folders["ledger"])]),
        "counts": _counts([c for c, _ in _collected(folders["counts"])]),
        "dead": _dead([t for t, _ in _collected(folders["dead"])]),
    }


def _release_values(rows) -> dict:
    values = {(r["query_id"], r["window_id"], r["coordinate"]): r["value"] for r in rows}
    assert len(values) == len(rows), "a (query, window, coordinate) was released twice"
    return values


def _ledger_values(tables) -> dict:
    used = {}
    for table in tables:
        for user, value in zip(table.column("user_id").to_pylist(), table.column("used").to_pylist()):
            assert user not in used, f"user {user} is in two shards' ledgers"
            used[user] = value
    return used


def _counts(items) -> dict:
    totals: dict = {}
    for window, counts in items:
        for status, n in counts.items():
            totals[(window, status)] = totals.get((window, status), 0) + n
    return totals


def _dead(tables) -> list:
    rows = [r for t in tables for r in t.to_pylist()]
    return sorted((r["source"], r["row_index"], r["reason"]) for r in rows)


def _daily_events(tables) -> list:
    """Each day's rows at that day's start, then the watermark to that day's end."""
    events = []
    for table in tables:
        window = table.column("window_id")[0].as_py()
        events += [("rows", table, _start(window)), ("watermark", _end(window))]
    return events


def _assert_same(streamed: dict, batch: dict) -> None:
    assert streamed.keys() == batch.keys()
    for key, value in batch.items():
        assert streamed[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_watermark_advance_releases_each_window_equal_to_the_batch_path(tmp_path):
    files = _random_days(tmp_path, 3)
    params = _params(tmp_path, end=2, budget=0.3)  # tight: some users are dropped on later days
    batch = _batch(tmp_path, files, params)
    streamed = _stream(tmp_path, _daily_events(_validated(files)), params)
    _assert_same(streamed["releases"], batch["releases"])
    _assert_same(streamed["ledger"], batch["ledger"])
    assert streamed["counts"] == batch["counts"]
    assert any(status == "dropped" and n for (_, status), n in batch["counts"].items())
    for d, table in enumerate(_validated(files)):  # every row charged once: statuses add up to rows
        assert sum(n for (w, _), n in streamed["counts"].items() if w == W0 + d) == table.num_rows
    # Released at the window's end (the watermark passing it), not held to the end of the stream.
    assert streamed["release_times"] == {W0 + d: _end(W0 + d) for d in range(3)}


def test_a_late_row_is_dead_lettered_and_charges_nobody(tmp_path):
    files = _random_days(tmp_path, 2, seed=1)
    params = _params(tmp_path, end=1)
    tables = _validated(files)
    on_time = _stream(tmp_path, _daily_events(tables), params, name="on_time")
    late_row = tables[0].slice(0, 1)  # day 0's first row again, after day 0 was released
    late_user = late_row.column("user_id")[0].as_py()
    late = _stream(tmp_path, _daily_events(tables) + [("rows", late_row, _start(W0))], params, name="late")
    assert late["dead"] == [(files[0], late_row.column("_row")[0].as_py(), "late_window")]  # named by its file
    assert on_time["dead"] == []
    assert late["ledger"] == on_time["ledger"]  # nobody charged for it
    assert late["ledger"][late_user] == on_time["ledger"][late_user]
    assert late["releases"] == on_time["releases"]  # no release changed


def test_a_window_without_rows_is_released_as_pure_noise_like_batch(tmp_path):
    files = [_write_day(tmp_path / "d0.parquet", 0, [1, 2, 3], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0]),
             _write_day(tmp_path / "d2.parquet", 2, [1, 4], [1.0, 1.0], [0.0, 0.5])]
    params = _params(tmp_path, end=2)
    batch = _batch(tmp_path, files, params)
    streamed = _stream(tmp_path, _daily_events(_validated(files)), params)
    _assert_same(streamed["releases"], batch["releases"])
    key = NoiseBinding(NoiseKey.load(params["key_path"]), params["ledger_id"])
    for j, column in enumerate(COLUMNS):
        query_id = tx.query_id_for(column)
        noise = gaussian_noise(key, query_id=query_id, window_id=W0 + 1, dim=1, noise_std=params["noise_std"])
        assert streamed["releases"][(query_id, W0 + 1, 0)] == pytest.approx(float(noise[0]), rel=1e-12)
    assert streamed["release_times"][W0 + 1] == _end(W0 + 1)


@pytest.mark.parametrize("policy", ["drop", "clip"])
def test_a_users_budget_carries_across_windows_in_streaming(tmp_path, policy):
    # User 7 gives ||q||^2 = 1 per day, charge 1 / (2 * 2^2) = 0.125 against kappa = 0.3: two
    # days fit and the third is dropped (or clipped to the 0.05 left). A window-scoped ledger
    # would admit all three.
    files = [_write_day(tmp_path / f"d{d}.parquet", d, [7, 100 + d], [1.0, 0.0], [0.0, 1.0]) for d in range(3)]
    params = _params(tmp_path, end=2, budget=0.3, policy=policy)
    batch = _batch(tmp_path, files, params)
    streamed = _stream(tmp_path, _daily_events(_validated(files)), params)
    status = "dropped" if policy == "drop" else "clipped"
    assert streamed["counts"][(W0 + 2, status)] == 1
    assert streamed["counts"][(W0 + 1, status)] == 0
    assert streamed["counts"] == batch["counts"]
    _assert_same(streamed["ledger"], batch["ledger"])
    _assert_same(streamed["releases"], batch["releases"])
    assert streamed["ledger"][7] == pytest.approx(0.25 if policy == "drop" else 0.3, rel=1e-6)
    assert streamed["ledger"][7] <= 0.3


def test_rows_of_a_window_arriving_out_of_order_charge_as_in_event_time_order(tmp_path):
    files = _random_days(tmp_path, 2, seed=2)
    # A second row of day 0's first user, in a later file: the row first in input position must
    # win (the other is a duplicate), whichever of the two arrives first.
    first = pq.read_table(files[0]).slice(0, 1)
    files.append(_write_day(tmp_path / "dup.parquet", 0, first.column("user_id").to_pylist(), [0.0], [0.25]))
    params = _params(tmp_path, end=1, budget=0.2)
    day0, day1, dup = _validated(files)
    in_order = _stream(tmp_path, _daily_events([day0])[:1] + _daily_events([dup]) + _daily_events([day1]),
                       params, name="in_order")
    rng = np.random.default_rng(5)
    early0, *rest0 = np.array_split(rng.permutation(day0.num_rows), 3)
    early1, *rest1 = np.array_split(rng.permutation(day1.num_rows), 2)
    # Day 1's first piece comes before day 0's rows and the duplicate before its original.
    events = [("rows", day1.take(pa.array(early1)), _start(W0 + 1)), ("rows", dup, _start(W0))]
    events += [("rows", day0.take(pa.array(piece)), _start(W0)) for piece in reversed([early0, *rest0])]
    events += [("watermark", _end(W0))]
    events += [("rows", day1.take(pa.array(piece)), _start(W0 + 1)) for piece in rest1]
    events += [("watermark", _end(W0 + 1))]
    shuffled = _stream(tmp_path, events, params, name="shuffled")
    batch = _batch(tmp_path, files, params)
    assert in_order["dead"] == shuffled["dead"] == batch["dead"] == [(files[2], 0, "duplicate_user_window")]
    _assert_same(in_order["ledger"], batch["ledger"])
    _assert_same(shuffled["ledger"], in_order["ledger"])
    _assert_same(shuffled["releases"], in_order["releases"])
    assert shuffled["counts"] == in_order["counts"]


def test_running_totals_in_streaming_equal_the_batch_path(tmp_path):
    # A running query queries users with history but no row (user 1 after day 0): every shard
    # with history must step every window, rows or not, as the batch path does.
    files = [_write_day(tmp_path / "d0.parquet", 0, [1, 2, 3], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]),
             _write_day(tmp_path / "d2.parquet", 2, [2, 4], [1.0, 1.0], [0.0, 0.5])]
    params = _params(tmp_path, end=3, budget=0.5)
    params["plan"] = QueryPlan.starting_at(default_queries(COLUMNS) + default_queries(["opened"], kind="running"), W0)
    batch = _batch(tmp_path, files, params)
    streamed = _stream(tmp_path, _daily_events(_validated(files)) + [("watermark", _end(W0 + 3))], params)
    assert {q for q, _, _ in streamed["releases"]} == {"sum:opened", "sum:bought", "running:opened"}
    _assert_same(streamed["releases"], batch["releases"])
    _assert_same(streamed["ledger"], batch["ledger"])
    # Day 0 alone costs user 1 (1^2 + 0^2 + 1^2) / (2 * 2^2) = 0.25; more means later windows charged it.
    assert streamed["ledger"][1] > 0.25 + 1e-6


class _Bag:
    def __init__(self):
        self.items = []

    def add(self, item):
        self.items.append(item)

    def read(self):
        return list(self.items)

    def clear(self):
        self.items = []


class _Value:
    def __init__(self):
        self.value = None

    def read(self):
        return self.value

    def write(self, value):
        self.value = value

    def clear(self):
        self.value = None


def _row_bags() -> dict:
    """The filter's row bags and its count of rows per window, as its methods take them, empty."""
    return {name: _Value() if name == "buffered_rows" else _Bag() for name in ROW_BAG_PARAMS}


def _rows_held(bags: dict) -> list:
    """Every ``(window, part)`` the row bags hold."""
    return [item for name, bag in bags.items() if name != "buffered_rows" for item in bag.read()]


class _Timer:
    def __init__(self):
        self.times = []

    def set(self, timestamp):
        self.times.append(int(timestamp))


def test_a_repeated_or_early_timer_firing_charges_a_window_once(tmp_path):
    # The FnApiRunner has been seen to fire a watermark timer more often than set: an extra
    # firing must neither charge a window twice nor charge the next window before its end.
    params = _params(tmp_path, end=1)
    fn = StreamingIndividualFilterDoFn(
        plan=params["plan"], window=SPEC, start_window=W0, end_window=W0 + 1, indicator_columns=COLUMNS,
        noise_std=params["noise_std"], policy="drop", budget=1.0, id_type="int64", tracker_step=1 / 32)
    files = [_write_day(tmp_path / "d0.parquet", 0, [1, 2], [1.0, 1.0], [0.0, 1.0])]
    rows, state, charged, books, mark, timer = _row_bags(), _Bag(), _Value(), _Value(), _Value(), _Timer()
    for table in _validated(files):
        list(fn.process((0, ("rows", table)), **rows, state=state, charged=charged, books=books, mark=mark,
                        window_end=timer))
    assert timer.times[-1] == _end(W0)

    def fire(at):
        return list(fn.on_window_end(key=0, timestamp=at, **rows, state=state, charged=charged, books=books,
                                     mark=mark, window_end=timer))

    first = fire(_end(W0))
    reports = [out for out in first if not isinstance(out, beam.pvalue.TaggedOutput)]
    assert [(w, shard, sorted(sums)) for w, (shard, sums) in reports] == [(W0, 0, ["sum:bought", "sum:opened"])]
    ledger = state.read()[0][1].column("used").to_pylist()
    assert fire(_end(W0)) == []  # the same firing again: nothing
    assert fire(_end(W0 + 1) - 1) == []  # before the next window's end: nothing
    assert charged.read() == W0 and timer.times[-1] == _end(W0 + 1)
    assert state.read()[0][1].column("used").to_pylist() == ledger
    assert _rows_held(rows) == [] and rows["buffered_rows"].read() == {}  # the charged window's rows are dropped
    last = fire(MAX_TIMESTAMP)  # a late firing charges the next window (no rows: a report), once
    assert charged.read() == W0 + 1
    assert [out for out in last if not isinstance(out, beam.pvalue.TaggedOutput)] == [(W0 + 1, (0, {}))]
    assert [out.tag for out in last if isinstance(out, beam.pvalue.TaggedOutput)] == ["books", "ledger"]
    assert fire(MAX_TIMESTAMP) == []


def test_the_filters_timer_callbacks_are_named_for_when_they_run():
    # ``charge`` is the engine's operation (ShardState.charge_window); a timer callback says when
    # it runs: after the last input (batch) or at a window's end (streaming).
    from apache_beam.transforms.userstate import TimerSpec

    callbacks = {cls.__name__: sorted(spec._attached_callback.__name__ for spec in vars(cls).values()
                                      if isinstance(spec, TimerSpec))
                 for cls in (tx.IndividualFilterDoFn, StreamingIndividualFilterDoFn)}
    assert callbacks == {"IndividualFilterDoFn": ["on_end_of_input"],
                         "StreamingIndividualFilterDoFn": ["on_window_end"]}
    assert not hasattr(tx.IndividualFilterDoFn, "charge") and not hasattr(StreamingIndividualFilterDoFn, "charge")


def test_a_window_is_released_once_when_every_shard_has_reported(tmp_path):
    params = _params(tmp_path, n_shards=2)
    release = ReleaseCompletedWindow(tx.ReleaseWindow(
        key_path=params["key_path"], plan=params["plan"], noise_std=params["noise_std"], window=SPEC,
        accounting="gdp", key_fingerprint=params["key_fingerprint"], ledger_id=params["ledger_id"]), n_shards=2)
    release.setup()
    shards, released = _Bag(), _Value()

    def report(shard, sums):
        return list(release.process((W0, (shard, sums)), shards=shards, released=released))

    assert report(0, {"sum:opened": np.array([2.0])}) == []
    assert report(0, {"sum:opened": np.array([2.0])}) == []  # a repeated report is not a second shard
    rows = report(1, {})  # shard 1 had no rows: its report completes the window
    assert sorted(r["query_id"] for r in rows) == ["sum:bought", "sum:opened"]
    key = NoiseBinding(NoiseKey.load(params["key_path"]), params["ledger_id"])
    noise = gaussian_noise(key, query_id="sum:opened", window_id=W0, dim=1, noise_std=params["noise_std"])
    assert [r["value"] for r in rows if r["query_id"] == "sum:opened"] == [pytest.approx(2.0 + noise[0], rel=1e-12)]
    assert report(1, {}) == [] and report(0, {}) == []  # released once, never again


def test_a_release_state_recording_the_releases_whole_continues_the_estimates_as_its_decoder_state():
    """This version commits a running query's decoder state with each window (RUNNING_DECODER); a
    state file an earlier version wrote holds the releases y from the first window instead
    (RUNNING_RAW). Both continue the estimates identically; a recorded series with a window
    missing is refused, naming the query."""
    import json

    from renyi_stream.pipelines.beam.running_releases import running_release_for
    from renyi_stream.pipelines.streaming.file_metadata import RUNNING_QUERY_ID, RUNNING_RAW
    from renyi_stream.pipelines.streaming.running_state import running_state_of, running_state_table
    from renyi_stream.queries.linear import LinearQuery

    plan = QueryPlan.starting_at([LinearQuery.columns("total", ["opened"], kind="running")], W0)
    running = plan.running_query("total", 2.0)
    release = running_release_for(plan.get("total"), None)
    ys = np.random.default_rng(4).normal(size=(6, 1)) * 5
    decoder = None
    for t, y in enumerate(ys):
        _, decoder = running.estimate_online(W0 + t, decoder, y)
    for t in range(6):  # the release state after the sixth window, as the job commits it with the decoder
        release.release(W0 + t, np.array([0.0]))
    query_id, _, written = running_state_of(running_state_table(release, decoder))
    assert query_id == "total" and written.windows == 6 and np.array_equal(written.state(running, W0 + 6), decoder)
    old = release.to_arrow()
    old = old.replace_schema_metadata({**old.schema.metadata, RUNNING_QUERY_ID.encode(): b"total",
                                       RUNNING_RAW.encode(): json.dumps([[W0 + t, [float(y[0])]]
                                                                         for t, y in enumerate(ys)]).encode()})
    _, _, recorded = running_state_of(old)
    assert np.array_equal(recorded.state(running, W0 + 6), decoder)
    with pytest.raises(ValueError, match=r"running query 'total': the recorded releases are for windows .* not every"):
        recorded.state(running, W0 + 7)
    with pytest.raises(ValueError, match="metadata is incomplete or malformed"):
        running_state_of(release.to_arrow())


def test_running_release_rows_carry_each_windows_estimate_std_from_a_table_kept_across_windows():
    """The std of a running estimate at a window does not depend on the horizon it is computed
    over: kept in a table doubled as windows pass it, each row's std is RunningQuery.estimate_std's,
    exactly, across the doublings (no window recomputes every variance so far)."""
    from renyi_stream.queries.linear import LinearQuery

    plan = QueryPlan.starting_at([LinearQuery.columns("total", ["opened"], kind="running")], W0)
    estimates = tx.RunningEstimates(plan=plan, noise_std=2.5, window=SPEC, accounting="gdp", key_fingerprint="ab" * 8)
    running = plan.running_query("total", 2.5)
    for w in [W0, W0 + 1, W0 + 63, W0 + 64, W0 + 200, W0 + 129]:
        (row,) = estimates.rows("total", w, np.array([1.0]))
        assert row["noise_std"] == running.estimate_std(w) and row["window_id"] == w


def test_a_decoder_state_of_another_window_count_or_not_finite_is_refused_naming_it():
    """The decoder state of BLT has the same shape at every window: the number of windows it has
    decoded is recorded and checked against the release state's, and its values must be finite,
    so a state from another window, or corrupted, never continues the estimates silently."""
    from renyi_stream.pipelines.streaming.running_state import EstimateContinuation

    good = EstimateContinuation(decoder=np.zeros((5, 1)), windows=6)
    good.check(W0, W0 + 6)
    with pytest.raises(ValueError, match=r"has decoded 6 window\(s\), its release state 7"):
        good.check(W0, W0 + 7)
    with pytest.raises(ValueError, match="non-finite values"):
        EstimateContinuation(decoder=np.full((5, 1), np.nan), windows=6).check(W0, W0 + 6)
