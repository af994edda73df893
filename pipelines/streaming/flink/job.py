"""The streaming job as a PyFlink DataStream job: a bounded replay of day files (``--replay``) or a
Kafka topic (``--kafka-topic T --bootstrap-servers H:P``), the same options ``renyi-stream stream``
takes, the same files the Beam job writes.

::

    flink run -pym renyi_stream.pipelines.streaming.flink -- \\
        --replay day1.parquet day2.parquet --columns opened,bought --start 2026-03-01 --end 2026-03-02 \\
        --epsilon 1 --delta 1e-6 --norm-budget 30 --noise-key noise.key \\
        --releases-parquet public/ --output curator/ [--parallelism 4]

    flink run -pym renyi_stream.pipelines.streaming.flink -- \\
        --kafka-topic indicators --bootstrap-servers localhost:9092 \\
        --kafka-consumer-config auto.offset.reset=earliest [--kafka-bounded] ...

(:func:`renyi_stream.pipelines.streaming.flink.launch.flink_run_command` builds that command for the
project's local cluster.) This module says only how Flink wires the job; what it does is the
runner-independent machinery of :mod:`renyi_stream.pipelines.streaming`, wired as the Beam shell
(:mod:`renyi_stream.pipelines.streaming.beam.job`) wires it:

* the launch: :func:`~renyi_stream.pipelines.streaming.options.parse_args`,
  :func:`~renyi_stream.pipelines.streaming.job_plan.prepare_output`,
  :func:`~renyi_stream.pipelines.streaming.job_plan.plan_job`, the catalogue recorded
  (:func:`~renyi_stream.pipelines.streaming.job_plan._record_queries`), the state file
  (:func:`~renyi_stream.pipelines.streaming.recovery.record_state_file`), and after the job the books
  (:func:`~renyi_stream.pipelines.streaming.books.record_books`), all in the client process that
  ``flink run`` starts;
* the graph: the replayed files (one element per file, read in a Python worker), or the Kafka
  records as ``(topic/partition/offset, value)`` messages
  (:mod:`renyi_stream.pipelines.streaming.flink.kafka_source`) -> decoded and
  validated (:class:`~renyi_stream.pipelines.streaming.codec.MessageValidator`) -> split by the
  project's ``shard_of`` into ``--shards`` shards (far more than slots) -> ``key_by(shard)`` ->
  :class:`~renyi_stream.pipelines.streaming.flink.state.ShardFilterFunction` (the shared
  :class:`~renyi_stream.pipelines.streaming.shard_filter.ShardFilter` in Flink keyed state, one
  event-time timer per shard at the end of its next uncharged window) -> the shards' reports
  ``key_by(window)`` -> the window's release
  (:class:`~renyi_stream.pipelines.streaming.window_releases.CompletedWindowRelease`) -> running
  queries ``key_by(query)`` (:class:`~renyi_stream.pipelines.streaming.window_releases.RunningReleaseInOrder`) -> release rows and
  states ``key_by(window)`` -> :class:`~renyi_stream.pipelines.streaming.commits.WindowStaging`;
  ledger snapshots, books records and prepaid rows written (named by content) -> every window's
  events under one key -> :class:`~renyi_stream.pipelines.streaming.commits.WindowCommits` (marker,
  then publication: first write wins).

Event time: a replayed file carries none, and no intermediate watermark is emitted; the bounded
source's end brings the final watermark, on which every shard charges its windows in order (each
firing re-arms the next window's timer, which fires on the same watermark). So every row is
buffered before any window is charged, as in the DirectRunner's replay. From Kafka, the record
timestamp is the event time and the watermark follows it per partition (idle partitions do not
hold it back): a shard charges a window as soon as the watermark passes its end, while the stream
goes on; a row of a window its shard already charged is a ``late_window`` dead letter (the
producer rule of :mod:`renyi_stream.pipelines.streaming.kafka` keeps that from happening to rows
produced in time). With ``--kafka-bounded`` the read ends at the offsets latest at the job's start
and the job ends (then the books are recorded, as after a replay); without it the job runs until
it is cancelled (it charges nothing past ``--end``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import re
import sys
from typing import Any, Iterator, Sequence

from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.beam.job_options import RunRefused
from renyi_stream.pipelines.beam.release_steps import RunningQueryReleases, RunningTotalRows, WindowQueryReleases
from renyi_stream.pipelines.beam.rows import packed_by_shard
from renyi_stream.pipelines.cli.errors import worded
from renyi_stream.pipelines.streaming.books import record_books, write_window_records
from renyi_stream.pipelines.streaming.codec import MessageValidator
from renyi_stream.pipelines.streaming.commits import WindowCommits, WindowStaging, _snapshot_written, write_prepaid
from renyi_stream.pipelines.streaming.job_plan import JobPlan, _record_queries, plan_job, prepare_output
from renyi_stream.pipelines.streaming.options import _parser, key_fingerprint
from renyi_stream.pipelines.streaming.options import parse_args as parse_job_args
from renyi_stream.pipelines.streaming.recovery import record_state_file
from renyi_stream.pipelines.streaming.replay import _replayed_file, check_replay, replay_names, replay_numbers
from renyi_stream.pipelines.streaming.shard_filter import ShardFilter
from renyi_stream.pipelines.streaming.snapshots import _ledger_file
from renyi_stream.pipelines.streaming.state_folder import RUNNING_STATE, STAGED_RELEASES, _write_named
from renyi_stream.pipelines.streaming.window_releases import CompletedWindowRelease, RunningReleaseInOrder, shard_ticks
from renyi_stream.queries import release_lineage as lineage
from renyi_stream.queries.catalogue import CatalogueChanged
from renyi_stream.queries.registration import recorded_plan

PROG = "python -m renyi_stream.pipelines.streaming.flink"
#: The one key every window's commit events travel under (:class:`WindowCommits`: windows in order).
COMMIT_KEY = 0


# --- the runner's own options ------------------------------------------------------------------------


def _runner_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--parallelism", type=int, default=None)
    parser.add_argument("--checkpointing-interval", "--checkpointing_interval", dest="checkpointing_interval",
                        type=int, default=None, metavar="MS")
    parser.add_argument("--kafka-bounded", "--kafka_bounded", dest="kafka_bounded", action="store_true")
    return parser


def refuse_unknown_options(runner_args: Sequence[str], known: Any = None, *, command: str = PROG) -> None:
    """ValueError naming any option neither the stream job's nor this runner's (``--parallelism N``,
    ``--checkpointing-interval MS``, ``--kafka-bounded``): a typo would run the job without it."""
    _, unknown = _runner_parser().parse_known_args(list(runner_args))
    if unknown:
        raise ValueError(f"unrecognized arguments: {' '.join(unknown)} (the Flink job takes the stream job's "
                         "options and --parallelism, --checkpointing-interval, --kafka-bounded)")


def parse_args(argv: Sequence[str], prog: str = PROG) -> tuple[argparse.Namespace, argparse.Namespace]:
    """``(job arguments, runner arguments)`` of ``argv``; a leading ``--`` (what ``flink run``
    passes on after its own options) is dropped."""
    argv = list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    args, rest = parse_job_args(argv, prog, runner_options=refuse_unknown_options)
    return args, _runner_parser().parse_args(rest)


def _refusal(args: argparse.Namespace, runner: argparse.Namespace | None = None) -> str | None:
    """Why the Flink job refuses ``args`` (None: it runs them): a dry run (the DirectRunner's), a
    Pub/Sub subscription (read on Dataflow only), Beam's Kafka expansion service (Flink reads Kafka
    with its own connector), ``--kafka-bounded`` without ``--kafka-topic``, a noise key secret."""
    if args.dry_run:
        return "argument --dry-run: a dry run previews on the DirectRunner (python -m renyi_stream.pipelines.streaming)"
    if getattr(args, "subscription", None):
        return ("argument --subscription: the Flink job reads Kafka (--kafka-topic) or replays files (--replay); "
                "a Pub/Sub subscription is read by the Beam job on Dataflow (python -m renyi_stream.pipelines.streaming "
                "--runner DataflowRunner)")
    if getattr(args, "kafka_expansion_service", None):
        return ("argument --kafka-expansion-service: the Flink job reads Kafka with Flink's own Kafka connector; "
                "the expansion service is the Beam job's")
    if runner is not None and getattr(runner, "kafka_bounded", False) and not args.kafka_topic:
        return "argument --kafka-bounded: only goes with --kafka-topic"
    if getattr(args, "noise_key_secret", None):
        return "argument --noise-key-secret: the Flink job reads the key from --noise-key, a file every worker reads"
    return None


# --- the steps as Flink functions ------------------------------------------------------------------


def read_and_validate(item: tuple[str, str], *, keys: Any, validator: MessageValidator) -> Iterator[Any]:
    """A replayed file ``(name, path)`` -> its validator's ``(tag, value)`` outputs."""
    yield from validator.validate(_replayed_file(item, keys))


def by_shard(tagged: tuple[str | None, Any], n_shards: int) -> Iterator[Any]:
    """Valid rows -> ``(shard, ("rows", packed rows))`` per shard present (the project's ``shard_of``)."""
    yield from packed_by_shard(tagged[1], n_shards)


def _has(tag: str | None) -> Any:
    return functools.partial(_tag_is, tag)


def _tag_is(tag: str | None, element: tuple[str | None, Any]) -> bool:
    return element[0] == tag


def _value_of(element: tuple[str | None, Any]) -> Any:
    return element[1]


def _first(element: tuple) -> Any:
    return element[0]


def _int_key(element: tuple) -> int:
    """An element's key (a shard or a window) as Flink's INT key type takes it (a Python int)."""
    return int(element[0])


def _str_key(element: tuple) -> str:
    return str(element[0])


def _process(step: Any, element: Any, **state: Any) -> Any:
    return step.process(element, **state)


def _stage(step: WindowStaging, element: Any, **state: Any) -> Any:
    return step.stage(element, **state)


def _commit(step: WindowCommits, element: Any, **state: Any) -> Any:
    return step.commit(element, **state)


def _by_window(row: dict) -> tuple[int, Any]:
    return int(row["window_id"]), row


def _under_commit_key(event: Any) -> tuple[int, Any]:
    return COMMIT_KEY, event


def write_table(element: Any, *, root: str, folder: Any = None) -> str:
    """A curator table -> one Parquet file under ``root`` named by its content (the Beam shell's
    ``WriteTable``: a replayed write rewrites the same file)."""
    sub, table = folder(element) if folder else ("", element)
    return _write_named(root, sub, table)


def _item(items: Sequence[Any], index: int) -> Any:
    return items[index]


def collection(env: Any, items: Sequence[Any]) -> Any:
    """A bounded stream of ``items`` (any picklable objects). PyFlink's ``from_collection`` takes
    Python objects of one Flink type only (a tuple under the pickled type is refused at submission):
    the indices go through Flink, the items with the function that maps them back."""
    from pyflink.common import Types

    from renyi_stream.pipelines.streaming.flink.state import PICKLED

    items = list(items)
    return env.from_collection(list(range(len(items))), type_info=Types.INT()).map(
        functools.partial(_item, items), output_type=PICKLED)


def _labelled(label: str) -> Any:
    return functools.partial(_label, label)


def _label(label: str, value: Any) -> tuple[str, str]:
    return label, str(value)


# --- the graph -------------------------------------------------------------------------------------


def shard_filter(job: JobPlan, args: argparse.Namespace) -> ShardFilter:
    """The shard filter, built as the Beam shell's ``StreamingReleases`` builds it."""
    config = job.config
    meta = {q: {k.decode(): v.decode() for k, v in t.schema.metadata.items()} for q, t in job.prepaid.items()}
    return ShardFilter(
        plan=job.plan, window=job.spec, start_window=job.start, end_window=job.end,
        indicator_columns=job.indicators, noise_std=config.noise_std, policy=args.policy, budget=config.rho,
        id_type=config.id_type, tracker_step=config.tracker_step,
        released=[w for w in job.released if w < job.start], running_meta=meta, snapshot_every_window=True,
        resumed_through=job.own if job.own >= job.start else None, window_records=True,
        compact_every=args.full_snapshot_every, cached_shards=config.n_shards,
        prepaid_every_window=bool(job.plan.running or meta), progress=bool(getattr(args, "progress", False)))


def release_steps(job: JobPlan) -> tuple[CompletedWindowRelease, RunningReleaseInOrder]:
    """The window release and the running queries' release, as the Beam shell builds them."""
    config = job.config
    window = CompletedWindowRelease(
        WindowQueryReleases(key_path=job.key_path, plan=job.plan, noise_std=config.noise_std, window=job.spec,
                            accounting=config.accounting, key_fingerprint=config.key_fingerprint,
                            ledger_id=config.ledger_id), config.n_shards, job.plan)
    running = RunningReleaseInOrder(
        RunningQueryReleases(key_path=job.key_path, plan=job.plan, noise_std=config.noise_std, schedule=(),
                             key_fingerprint=config.key_fingerprint, ledger_id=config.ledger_id),
        RunningTotalRows(plan=job.plan, noise_std=config.noise_std, window=job.spec, accounting=config.accounting,
                         key_fingerprint=config.key_fingerprint), job.plan,
        previous_release=job.release_states, previous_estimates=job.estimates)
    return window, running


def read_message(message: tuple[str, bytes], *, validator: MessageValidator) -> Iterator[Any]:
    """A Kafka message ``(topic/partition/offset, value)`` -> its validator's ``(tag, value)`` outputs."""
    yield from validator.validate(message)


def build(env: Any, args: argparse.Namespace, job: JobPlan, *, kafka_bounded: bool = False) -> Any:
    """The streaming graph on ``env`` (a PyFlink ``StreamExecutionEnvironment``); returns the stream
    of ``(kind, path)`` of every file the job writes, public files ``("public", path)``. The source:
    ``--replay``'s files, else ``--kafka-topic``'s records
    (:func:`renyi_stream.pipelines.streaming.flink.kafka_source.kafka_messages`, read to the offsets
    latest at the start with ``kafka_bounded``); everything after the decoding is the same graph."""
    from pyflink.common import Types

    from renyi_stream.pipelines.streaming.flink.state import PICKLED, KeyedStep, ShardFilterFunction, _pairs

    config, curator = job.config, job.curator
    n_shards = config.n_shards
    replay = list(args.replay or ())
    # A Kafka message's rows are numbered by a hash of its name, a replayed file's by its place.
    validator = MessageValidator(window=job.spec, indicator_columns=job.indicators, stamp=bool(replay),
                                 id_type=job.id_type, category_columns=job.categories, numbers=replay_numbers(replay),
                                 keys=job.keys)
    if replay:
        check_replay(replay, window=job.spec, indicator_columns=job.indicators, category_columns=job.categories,
                     id_type=job.id_type, contract=job.contract)
        files = collection(env, list(zip(replay_names(replay), replay)))
        decoded = files.flat_map(functools.partial(read_and_validate, keys=job.keys, validator=validator),
                                 output_type=PICKLED).name("DecodeAndValidate")
    else:
        from renyi_stream.pipelines.streaming.flink.kafka_source import kafka_messages

        decoded = kafka_messages(env, args, bounded=kafka_bounded).flat_map(
            functools.partial(read_message, validator=validator), output_type=PICKLED).name("DecodeAndValidate")
    rows = decoded.filter(_has(None)).flat_map(functools.partial(by_shard, n_shards=n_shards),
                                               output_type=PICKLED).name("ByShard")
    ticks = collection(env, shard_ticks(n_shards, job.previous, job.prepaid)).name("ShardTicks")
    filtered = (rows.union(ticks).key_by(_int_key, key_type=Types.INT())
                .process(ShardFilterFunction(shard_filter(job, args)), output_type=PICKLED).name("StreamingFilter"))

    window_release, running_release = release_steps(job)
    released = (filtered.filter(_has(None)).map(_value_of, output_type=PICKLED).key_by(_int_key, key_type=Types.INT())
                .process(KeyedStep(window_release, _process, bags=("shards",), values=("released",), outputs=_pairs),
                         output_type=PICKLED).name("ReleaseCompletedWindow"))
    running = (released.filter(_has("running_sums")).map(_value_of, output_type=PICKLED)
               .key_by(_str_key, key_type=Types.STRING())
               .process(KeyedStep(running_release, _process, bags=("pending",), values=("kept",), outputs=_pairs),
                        output_type=PICKLED).name("ReleaseRunning"))
    release_rows = released.filter(_has(None)).union(running.filter(_has(None))).map(
        _value_of, output_type=PICKLED).map(_by_window, output_type=PICKLED)
    states = running.filter(_has("release_state")).map(_value_of, output_type=PICKLED)
    staged = (release_rows.union(states).key_by(_int_key, key_type=Types.INT())
              .process(KeyedStep(WindowStaging(store.join(curator, STAGED_RELEASES), job.release_rows(),
                                               store.join(curator, RUNNING_STATE)), _stage, bags=("rows",)),
                       output_type=PICKLED).name("StageReleaseFiles")
              .map(_value_of, output_type=PICKLED))

    def tagged(tag: str) -> Any:
        return filtered.filter(_has(tag)).map(_value_of, output_type=PICKLED)

    dead = decoded.filter(_has("dead")).map(_value_of, output_type=PICKLED).union(tagged("dead"))
    dead_files = dead.map(functools.partial(write_table, root=store.join(curator, "dead")),
                          output_type=PICKLED).name("WriteDead")
    read_files = (decoded.filter(_has("read")).map(_value_of, output_type=PICKLED)
                  .map(functools.partial(write_table, root=store.join(curator, "read")), output_type=PICKLED)
                  .name("WriteRead"))
    ledger_file = functools.partial(_ledger_file, recorded=config.to_snapshot_metadata(), queries=job.first_answered,
                                    plan=recorded_plan(job.plan.entries), runs=job.runs)
    ledger_files = tagged("ledger").map(functools.partial(write_table, root=store.join(curator, "ledger"),
                                                          folder=ledger_file), output_type=PICKLED).name("WriteLedger")
    written = ledger_files.map(_snapshot_written, output_type=PICKLED)
    records = tagged("books").map(functools.partial(write_window_records, curator), output_type=PICKLED).name(
        "WriteWindowRecords")
    prepaid = tagged("prepaid").map(functools.partial(write_prepaid, curator), output_type=PICKLED).name(
        "WritePrepaid")
    commits = WindowCommits(curator, job.releases, n_shards, first_window=job.own + 1, end_window=job.end,
                            ledger_id=config.ledger_id, prepaid=job.with_prepaid, run=job.runs[0],
                            previous_run=job.runs[1])
    public = (staged.union(written, records, prepaid).map(_under_commit_key, output_type=PICKLED)
              .key_by(_int_key, key_type=Types.INT())
              .process(KeyedStep(commits, _commit, bags=("events",), values=("upcoming",), outputs=_tagged_public),
                       output_type=PICKLED).name("CommitWindows"))
    return public.union(dead_files.map(_labelled("dead"), output_type=PICKLED),
                        read_files.map(_labelled("read"), output_type=PICKLED),
                        ledger_files.map(_labelled("ledger"), output_type=PICKLED))


def _tagged_public(outputs: Any) -> Iterator[tuple[str, str]]:
    for path in outputs:
        yield "public", str(path)


def environment(runner: argparse.Namespace) -> Any:
    """The execution environment: streaming mode, ``--parallelism``, and with
    ``--checkpointing-interval`` checkpoints every that many milliseconds."""
    from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
    if runner.parallelism:
        env.set_parallelism(runner.parallelism)
    if runner.checkpointing_interval:
        env.enable_checkpointing(runner.checkpointing_interval)
    return env


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Plan the job, run it on the Flink cluster ``flink run`` submits to, wait for its end, then
    record the books (``_BOOKS.json``) as the Beam job does. Exit status 2 on a refusal."""
    parser = _parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    args, runner = parse_args(argv, prog)
    refused = _refusal(args, runner)
    if refused:
        print(f"{prog}: refused: {refused}", file=sys.stderr)
        return 2
    try:
        key_fingerprint(args)
        prepare_output(args)
        for _ in range(3):  # the catalogue as planned, unless a curator changed it meanwhile
            job = plan_job(args)
            try:
                for change in _record_queries(store.absolute(args.releases_parquet), job.queries, job.contract,
                                              job.config):
                    print(f"[streaming] {change}", file=sys.stderr)
                break
            except CatalogueChanged:
                continue
        else:
            raise RunRefused(f"the query catalogue under {store.absolute(args.releases_parquet)} kept "
                             "changing while this job was launched; launch it again")
        env = environment(runner)
        outputs = build(env, args, job, kafka_bounded=runner.kafka_bounded)
    except (RunRefused, ValueError, lineage.LineageConflict) as exc:
        print(f"{parser.prog}: refused: {worded(str(exc), args, parser)}", file=sys.stderr)
        return 2
    record_state_file(args)
    print(f"[streaming] submitted to Flink at {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
          file=sys.stderr, flush=True)
    written: dict[str, int] = {}
    try:
        source = "replay" if args.replay else f"kafka {args.kafka_topic}"
        with outputs.execute_and_collect(f"renyi-stream streaming ({source})") as results:
            for kind, _ in results:
                written[kind] = written.get(kind, 0) + 1
    except Exception as exc:  # the job's failure, through py4j: a lost lineage claim is a refusal
        text = f"{type(exc).__name__}: {exc}"
        if lineage.LineageConflict.__name__ not in text:
            raise
        conflict = re.search(r"LineageConflict: (.*)", text)
        print(f"{parser.prog}: refused: {conflict[1] if conflict else exc} (nothing of this job was published)",
              file=sys.stderr)
        return 2
    print(f"[streaming] the Flink job finished: {written.get('public', 0)} public release file(s) written",
          file=sys.stderr, flush=True)
    return record_books(args)


if __name__ == "__main__":
    sys.exit(main())
