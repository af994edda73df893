"""What the jobs share at launch: the one option group for the promise, the schedule, the key,
the shards and the window (:func:`add_ledger_options`, the same in ``renyi-stream run``,
``python -m renyi_stream.pipelines.distributed`` and ``python -m renyi_stream.pipelines.streaming``), the Beam jobs' further
launch options (:func:`add_promise_options`), parsing them, and the worker noise key's
fingerprint. What a ledger keeps for life and how a run continues it is
:class:`renyi_stream.stream.engine.ledger_config.LedgerConfig`. Anything that would break a promise, or cannot
be checked not to, is refused before launch (:class:`RunRefused`), and so is an option neither
the job nor Beam knows (:func:`refuse_unknown_options`, the one check of the three jobs). Imports
no Beam at import time (the ``renyi-stream`` command line parses with it); the option check
imports it when called."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from renyi_stream.stream.accounting import ACCOUNTINGS, DEFAULT_ACCOUNTING
from renyi_stream.stream.contract import ID_TYPES
from renyi_stream.stream.engine.ledger_config import DEFAULT_SHARDS
from renyi_stream.stream.ledger import Policy
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.schema import WindowSpec

if TYPE_CHECKING:
    from renyi_stream.stream.contract import InputContract
    from renyi_stream.stream.engine.input_days import DayRange

#: The option group's defaults (:func:`add_ledger_options`): one place for every job.
DEFAULT_WINDOW = "1d"
DEFAULT_POLICY = Policy.DROP.value
WORKER_KEY_DIR = "/tmp/renyi-stream-key"


class RunRefused(RuntimeError):
    """A run that would break a promise (or cannot be checked not to) is refused before launch."""


def parse_day(name: str, text: str, spec: WindowSpec) -> int:
    """``--start``/``--end`` (``YYYY-MM-DD``) as a window id; RunRefused naming ``name`` otherwise."""
    try:
        return spec.window_of_day(name, text)
    except ValueError as exc:
        raise RunRefused(str(exc)) from None


def window_seconds(text: str) -> int:
    """``--window`` (``1d``, ``12h``, ``30m``, ``3600s``) in seconds; RunRefused otherwise."""
    try:
        return WindowSpec.from_length(text).length_seconds
    except ValueError as exc:
        raise RunRefused(str(exc)) from None


def key_fingerprint(args: argparse.Namespace) -> tuple[str, str, NoiseKey | None]:
    """(worker key path, fingerprint, the key when the launcher could read it)."""
    if bool(args.noise_key) == bool(args.noise_key_secret):
        raise RunRefused("give exactly one of --noise-key (a key file every worker can read at that path, e.g. a "
                         "mounted secret) and --noise-key-secret (a Secret Manager version the workers fetch)")
    key = None
    if args.noise_key_secret:
        from renyi_stream.pipelines.beam import worker_key  # imports Beam: only where a secret is fetched

        if not args.key_fingerprint:
            key = NoiseKey(secret=worker_key.fetch_secret(args.noise_key_secret))
        fingerprint = args.key_fingerprint or key.fingerprint
        return f"{WORKER_KEY_DIR}/noise-{fingerprint}.key", fingerprint, key
    if Path(args.noise_key).is_file():
        key = NoiseKey.load(args.noise_key)
    elif not args.key_fingerprint:
        raise RunRefused(f"the noise key {args.noise_key} is not readable here: give --key-fingerprint (the "
                         "workers check the key they load against it)")
    fingerprint = key.fingerprint if key else args.key_fingerprint
    if args.key_fingerprint and key and key.fingerprint != args.key_fingerprint:
        raise RunRefused(f"the noise key {args.noise_key} has fingerprint {key.fingerprint}, not "
                         f"--key-fingerprint {args.key_fingerprint}")
    return args.noise_key, fingerprint, key


def add_promise_arguments(arg: Callable[..., Any]) -> None:
    """The promise's options (``--epsilon``, ``--delta``, ``--norm-budget``, ``--accounting``),
    added through ``arg`` (a parser's or a group's ``add_argument``): one set of names, defaults
    and choices for the jobs and ``renyi-stream plan``."""
    arg("--epsilon", type=float, required=True, help="per-user epsilon (> 0)")
    arg("--delta", type=float, required=True, help="per-user delta, in (0, 1)")
    arg("--norm-budget", "--norm_budget", dest="norm_budget", type=float, required=True,
        help="B, squared-norm budget per user (> 0)")
    arg("--accounting", choices=ACCOUNTINGS, default=DEFAULT_ACCOUNTING,
        help=f"how (epsilon, delta) maps to the zCDP budget (default {DEFAULT_ACCOUNTING})")


def add_ledger_options(parser: argparse.ArgumentParser, *, key_help: str, key_alias: bool = False) -> None:
    """The option group every job that charges a ledger shares, with the same names, defaults and
    choices in each (``tests/test_ledger_config.py`` fails when one drifts): the public schedule
    (``--start``, ``--end``), the promise (``--epsilon``, ``--delta``, ``--norm-budget``,
    ``--accounting``), the windows (``--window``), the noise key file (``--noise-key``), and how
    the filter runs (``--policy``, ``--shards``). ``key_help`` says where the job looks for the
    key; ``key_alias`` also accepts ``--key``, the name ``renyi-stream run`` and ``train`` gave
    ``--noise-key`` before, so that existing commands keep working."""
    group = parser.add_argument_group("the ledger: schedule, promise, noise key, windows and shards")
    arg = group.add_argument
    arg("--start", required=True, help="first window of the public schedule (YYYY-MM-DD)")
    arg("--end", required=True, help="last window of the public schedule (YYYY-MM-DD)")
    add_promise_arguments(arg)
    arg("--window", default=DEFAULT_WINDOW, help=f"window length: {DEFAULT_WINDOW} (default), 12h, 30m, 3600s")
    arg("--noise-key", "--noise_key", *(("--key",) if key_alias else ()), dest="noise_key", default=None,
        help=key_help + ("; --key is the same option (its former name)" if key_alias else ""))
    arg("--policy", choices=[p.value for p in Policy], default=DEFAULT_POLICY,
        help=f"what happens to a contribution past a user's budget (default {DEFAULT_POLICY})")
    arg("--shards", type=int, default=DEFAULT_SHARDS,
        help=f"user shards of the stateful filter (default {DEFAULT_SHARDS}; a later run may use another count: "
             "the ledger is split again by user)")
    add_contract_options(parser)


def add_input_day_options(parser: argparse.ArgumentParser) -> None:
    """The options that say which days a batch run's inputs hold, the same in ``renyi-stream
    run`` and the distributed job (:mod:`renyi_stream.stream.engine.input_days`); read them with
    :func:`input_day_options`."""
    group = parser.add_argument_group(
        "the inputs' days: every window a run releases must be covered by an input named for its day")
    arg = group.add_argument
    arg("--input-days", "--input_days", dest="input_days", default=None, metavar="FIRST[:LAST]",
        help="the days held by the input files whose path names no day (a file is named for its day by a "
             "day=YYYY-MM-DD/ folder or one YYYY-MM-DD in its name); default: the schedule, --start..--end. "
             "A row of another day is a dead letter")
    arg("--no-data-days", "--no_data_days", dest="no_data_days", action="append", default=[],
        metavar="DAY[:LAST]", help="days of the schedule that truly have no file: released as noise only, on "
                                   "purpose (comma-separated days or ranges; repeatable)")


def input_day_options(args: argparse.Namespace) -> "tuple[DayRange | None, tuple[DayRange, ...]]":
    """``(--input-days, --no-data-days)`` as :class:`renyi_stream.stream.engine.input_days.DayRange`
    values; ValueError naming the option otherwise."""
    from renyi_stream.stream.engine.input_days import parse_day_ranges

    input_days = None
    if args.input_days is not None:
        ranges = parse_day_ranges("--input-days", args.input_days)
        if len(ranges) != 1:
            raise ValueError(f"--input-days must be one day or one range FIRST:LAST, got --input-days {args.input_days}")
        input_days = ranges[0]
    no_data = tuple(r for text in args.no_data_days for r in parse_day_ranges("--no-data-days", text))
    return input_days, no_data


def add_contract_options(parser: argparse.ArgumentParser) -> None:
    """The input contract's options (:mod:`renyi_stream.stream.contract`), the same in every job and in
    ``renyi-stream features``; :func:`declared_contract` reads them."""
    contract = parser.add_argument_group(
        "the input contract: declared on the ledger's first run, kept for its life (nothing is inferred from values)")
    arg = contract.add_argument
    arg("--id-type", "--id_type", dest="id_type", choices=ID_TYPES, default=None,
        help="the ledger's user id type: int64 (ids written as canonical integers) or string (compared byte for byte)")
    arg("--column", dest="declared_columns", action="append", default=[], metavar="NAME[=LO:HI]",
        help="a numeric indicator column; with =LO:HI its default sum clamps each value to [LO, HI] (a column "
             "without a bound gets no default sum); repeat per column")
    arg("--category", dest="declared_categories", action="append", default=[], metavar="NAME",
        help="a text column of categories, read only by histograms over declared categories; repeat per column")
    arg("--id-column", "--id_column", dest="id_column", default=None, metavar="NAME",
        help="the column that holds the user id (default user_id), e.g. --id-column uid")
    time = contract.add_mutually_exclusive_group()
    time.add_argument("--day-column", "--day_column", dest="day_column", default=None, metavar="NAME",
                      help="the column that holds each row's day, a date or YYYY-MM-DD text (default: day, or "
                           "event_time for timestamps), e.g. --day-column event_date")
    time.add_argument("--event-time-column", "--event_time_column", dest="event_time_column", default=None,
                      metavar="NAME", help="the column that holds each row's time as a timestamp or ISO-8601 text "
                                           "(instead of --day-column), e.g. --event-time-column ts")
    arg("--schema", dest="schema_file", default=None, metavar="FILE.json",
        help='the contract as a JSON file: {"id_type": "int64", "columns": [{"name": "opened", "kind": "number", '
             '"lo": 0, "hi": 1}, {"name": "tier", "kind": "category"}]}, with optional "id_column", "day_column" '
             'or "event_time_column"')


def refuse_declared_columns(args: argparse.Namespace, *, job: str) -> None:
    """RunRefused for ``--column``/``--category``/``--schema`` in a job that does not enforce a
    declared contract yet (it takes ``--id-type``): a declaration it would not keep must not look kept."""
    if args.declared_columns or args.declared_categories or args.schema_file or declared_key_options(args):
        raise RunRefused(f"{job} does not take declared columns yet (--column, --category, --schema): "
                         "renyi-stream run enforces them; here declare the id type with --id-type and the "
                         "numeric columns with --columns")


def declared_key_options(args: argparse.Namespace) -> list[str]:
    """The key columns' options a run gives (``--id-column NAME``, ``--day-column NAME``,
    ``--event-time-column NAME``), as written."""
    return [f"{option} {value}" for option, value in (("--id-column", getattr(args, "id_column", None)),
                                                      ("--day-column", getattr(args, "day_column", None)),
                                                      ("--event-time-column", getattr(args, "event_time_column", None)))
            if value is not None]


def declared_contract(args: argparse.Namespace) -> "InputContract | None":
    """The contract a run's options declare (:func:`add_ledger_options`), None when they declare
    none. :class:`renyi_stream.stream.contract.ContractError` (a ValueError) for a malformed declaration,
    ``--schema`` beside the other contract options, or the key columns' names (``--id-column``,
    ``--day-column``, ``--event-time-column``) without the rest of a declaration: they are part of
    the contract, kept with it, so a later run leaves them out (the ledger keeps the recorded
    names) or declares the whole contract again, and a declaration of other names is refused."""
    from renyi_stream.stream.contract import ContractError, InputContract

    inline = bool(args.declared_columns or args.declared_categories)
    keys = declared_key_options(args)
    if args.schema_file is not None:
        if inline or args.id_type is not None or keys:
            raise ContractError("give the contract either as --schema FILE or as --id-type/--column/--category"
                                f"{'/' + keys[0].split()[0] if keys else ''}, not both (got --schema {args.schema_file}"
                                f"{' and ' + keys[0] if keys else ''}; a schema file names the id and time columns as "
                                '"id_column", "day_column" or "event_time_column")')
        return InputContract.from_file(args.schema_file)
    if not inline:
        if keys:
            raise ContractError(f"{keys[0]} is part of the input contract: give it with the contract's --id-type and "
                                "--column/--category options (or in --schema FILE.json); a ledger keeps the names its "
                                "contract records, so a later run may leave them out")
        return None
    return InputContract.from_options(id_type=args.id_type, columns=args.declared_columns,
                                      categories=args.declared_categories, id_column=getattr(args, "id_column", None),
                                      day_column=getattr(args, "day_column", None),
                                      event_time_column=getattr(args, "event_time_column", None))


def add_promise_options(parser: argparse.ArgumentParser) -> None:
    """The launch options the distributed and streaming jobs share: :func:`add_ledger_options`,
    the public release root, and the noise key as the workers get it."""
    add_ledger_options(parser, key_help="noise key file, at this path on every worker")
    arg = parser.add_argument
    arg("--releases-parquet", "--releases_parquet", dest="releases_parquet", required=True,
        help="public release root: <root>/window_id=<id>/releases.parquet")
    arg("--noise-key-secret", "--noise_key_secret", dest="noise_key_secret",
        help="Secret Manager version of the noise key (projects/P/secrets/S/versions/V), fetched by each worker")
    arg("--key-fingerprint", "--key_fingerprint", dest="key_fingerprint",
        help="the key's public fingerprint, when the launcher cannot (or should not) read the key")


#: Options Beam's Python SDK does not declare but hands on by name to the runner, which the deploy
#: scripts give (deploy/flink/submit-stream.sh): Java ``FlinkPipelineOptions``, read by Flink as
#: ``checkpointingInterval`` etc. The FlinkRunner passes them on only with
#: ``--flink_submit_uber_jar`` (it retains unknown options then); without it Beam drops them and
#: a streaming job would run without checkpoints (deploy/README.md, "Streaming mode").
FLINK_PASSED_ON = frozenset({"--checkpointing_interval", "--checkpointing_mode", "--min_pause_between_checkpoints",
                             "--externalized_checkpoints_enabled", "--retain_externalized_checkpoints_on_cancellation",
                             "--savepoint_path", "--allow_non_restored_state"})
FLINK_UBER_JAR = "--flink_submit_uber_jar"


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    """Every long option string of ``parser`` (``--norm-budget`` and its alias ``--norm_budget``)."""
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def beam_options() -> frozenset[str]:
    """Every option string Beam's ``PipelineOptions`` parse (``--runner``, ``--no_use_public_ips``,
    ``--worker_machine_type``, ...), as Beam's own parser holds them: aliases and negations
    included, of every options class imported so far (the project's own, e.g.
    :mod:`renyi_stream.pipelines.beam.worker_key`, once imported). Imports Beam."""
    import logging

    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(logging.ERROR)  # Beam's GCP extras warn at import when their optional clients are absent
    try:
        from apache_beam.options.pipeline_options import PipelineOptions

        parsers: list[argparse.ArgumentParser] = []
        # Beam builds its parser afresh on every call; the hook is its public way to reach it.
        PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    finally:
        root.setLevel(level)
    return frozenset(long_options(parsers[0]))


def refuse_unknown_options(beam_args: Sequence[str], ours: Iterable[str], *, command: str) -> None:
    """RunRefused naming the first option of ``beam_args`` (what ``command``'s own parser left for
    Beam; ``ours``: its long options) that Beam does not parse either, with the closest known
    option: a typo such as ``--polcy clip`` would otherwise only make Beam warn while the job ran
    without it (under the default ``--policy``). :data:`FLINK_PASSED_ON` are accepted when
    ``--flink_submit_uber_jar`` is given (the only case the runner hands them on), refused
    otherwise. The same check for ``renyi-stream run``, ``python -m renyi_stream.pipelines.distributed`` and
    ``python -m renyi_stream.pipelines.streaming``. Imports Beam, only when there is an option to check."""
    if not any(token.startswith("--") and token != "--" for token in beam_args):
        return  # nothing left for Beam: the common case costs no parser
    known = beam_options()
    uber_jar = any(a == FLINK_UBER_JAR or a.startswith(FLINK_UBER_JAR + "=") for a in beam_args)
    for token in beam_args:
        if not token.startswith("--") or token == "--":
            continue
        option = token.split("=", 1)[0]
        if option in known or (uber_jar and option in FLINK_PASSED_ON):
            continue
        if option in FLINK_PASSED_ON:
            raise RunRefused(f"argument {option}: a Java FlinkPipelineOptions option, which Beam hands on to Flink "
                             f"only with {FLINK_UBER_JAR}; without it the runner would drop it")
        import difflib

        candidates = sorted(set(ours) | known | FLINK_PASSED_ON)
        close = difflib.get_close_matches(option, candidates, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise RunRefused(f"argument {option}: not an option of {command} nor of Beam (a typo would be ignored){hint}")
