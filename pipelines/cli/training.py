"""``renyi-stream features`` and ``train``: the command line of the curator's training stage
(:mod:`renyi_stream.pipelines.features.job`, a Beam batch job, and :mod:`renyi_stream.pipelines.curator.train`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from renyi_stream.pipelines.beam.job_options import add_contract_options
from renyi_stream.pipelines.cli.errors import name_the_option
from renyi_stream.pipelines.curator.train import (DEFAULT_COUNT_FRACTION, DEFAULT_STOP_FRACTION, TrainConfig, TrainRefused,
                                     run_train)
from renyi_stream.stream.accounting import ACCOUNTINGS
from renyi_stream.stream.engine.ledger_config import DEFAULT_SHARDS


def _features_contract(args: argparse.Namespace) -> Any:
    """The input contract of a features run: declared by its options, or recorded by ``--ledger``
    (the ledger the model will be trained on); None when neither gives one. ValueError for both,
    or for a ledger that records none."""
    from renyi_stream.pipelines.beam.job_options import declared_contract
    from renyi_stream.pipelines.curator.store import CuratorStoreError, recorded_parameters

    declared = declared_contract(args)
    if args.ledger is None:
        if declared is None and args.id_type is not None:
            raise ValueError(f"--id-type {args.id_type} declares no column: give --column/--category too, or --ledger")
        return declared
    if declared is not None or args.id_type is not None:
        raise ValueError("give the input contract either as --ledger (the one it records) or declared, not both")
    if not Path(args.ledger).is_file():  # never created: a features run only reads the ledger's contract
        raise ValueError(f"--ledger {args.ledger} does not exist")
    try:
        params = recorded_parameters(args.ledger)  # read-only: nothing is written to the ledger
    except CuratorStoreError as exc:
        raise ValueError(str(exc)) from None
    if params is None or params.contract is None:
        raise ValueError(f"--ledger {args.ledger} records no input contract: declare it with --id-type and --column")
    return params.contract


def _features_command(args: argparse.Namespace) -> int:
    from renyi_stream.pipelines.beam.job_options import RunRefused, refuse_unknown_options
    from renyi_stream.pipelines.features.job import materialise_features
    from renyi_stream.stream.engine.readers import InputFileError

    # Beam options pass through as in ``renyi-stream run``: one neither this command nor Beam knows
    # is refused (a typo would be ignored), and --runner defaults to the DirectRunner, in memory.
    beam_args = list(args.beam_args)
    try:
        refuse_unknown_options(beam_args, args.option_names.values(), command="features")
    except RunRefused as exc:
        print(f"renyi-stream features: error: {exc}", file=sys.stderr)
        return 2
    if not any(a.startswith("--runner") for a in beam_args):
        beam_args.append(f"--runner={args.runner}")
        if args.runner == "DirectRunner" and not any(a.startswith("--direct_running_mode") for a in beam_args):
            beam_args.append("--direct_running_mode=in_memory")
    try:
        contract = _features_contract(args)
        summary = materialise_features(
            args.input, args.out, start=args.start, end=args.end, label_column=args.label_column,
            label_start=args.label_start, label_end=args.label_end, n_shards=args.shards, beam_args=beam_args,
            dead_letters=args.dead_letters, contract=contract)
    except (ValueError, InputFileError) as exc:
        print(f"renyi-stream features: error: {name_the_option(str(exc), args)}", file=sys.stderr)
        return 2 if not isinstance(exc, InputFileError) else 1
    if args.quiet:  # nothing printed carries an exact count
        print(f"wrote {len(summary.feature_columns)} features per user to {summary.path}")
        return 0
    print(f"wrote {summary.users:,} users x {len(summary.feature_columns)} features to {summary.path} "
          f"({summary.rows_read:,} rows read, {summary.rows_rejected:,} rejected; exact counts, for the curator only)")
    return 0


def _undeclared_charge(args: argparse.Namespace) -> str:
    """Why a ``train`` without ``--train-rho`` is refused, with the ledger's budget when the
    ledger exists (read-only: nothing is created or written)."""
    from renyi_stream.pipelines.curator.store import CuratorStoreError, recorded_parameters

    budget = ""
    try:
        params = recorded_parameters(args.ledger) if Path(args.ledger).is_file() else None
    except CuratorStoreError:
        params = None
    if params is not None:
        budget = f" (the ledger's budget kappa is {params.rho:.6g} zCDP per user; renyi-stream privacy-report shows a user's use)"
    return ("--train-rho is required: declare the zCDP per user this training run may charge, > 0 and at most the "
            f"ledger's budget kappa{budget}. There is no default: a run charges what the curator declares, never "
            "the whole remaining budget")


def _train_command(args: argparse.Namespace) -> int:
    if args.train_rho is None:
        print(f"renyi-stream train: error: argument --train-rho: {_undeclared_charge(args)}", file=sys.stderr)
        return 2
    try:
        config = TrainConfig(
            features=args.features, ledger=args.ledger, epsilon=args.epsilon, delta=args.delta, out=args.out,
            report=args.report, classes=args.classes, model=args.model, hidden=args.hidden, clip=args.clip,
            steps=args.steps,
            learning_rate=args.learning_rate, noise_multiplier=args.noise_multiplier,
            filtering=args.filtering, stopping=args.stopping and args.filtering,
            stop_queries=args.stop_queries, stop_every=args.stop_every, stop_fraction=args.stop_fraction,
            train_rho=args.train_rho, accounting=args.accounting, norm_budget=args.norm_budget,
            key_path=args.key, normaliser=args.normaliser, count_fraction=args.count_fraction,
            seed=args.seed, device=args.device, dtype=args.dtype, new_ledger=args.new_ledger,
        )
        summary = run_train(config, progress=None if args.quiet else sys.stderr)
    except ValueError as exc:
        print(f"renyi-stream train: error: {name_the_option(str(exc), args)}", file=sys.stderr)
        return 2
    except (TrainRefused, ImportError) as exc:
        print(f"renyi-stream train: error: {name_the_option(str(exc), args)}", file=sys.stderr)
        return 1
    # No exact count here (not even the number of users): this summary is printed with --quiet too.
    best = ""
    if summary.accuracy_queries:
        best = f"; kept step {summary.chosen_step} (best of {len(summary.accuracy_queries)} noisy accuracy queries)"
    divided = f"a noisy user count, {summary.normaliser:.1f}" if summary.normaliser_kind == "noisy count" \
        else f"the public normaliser {summary.normaliser:g}"
    print(f"trained in {summary.steps_run} steps{best}, dividing by {divided}; run zCDP <= {summary.run_rho:.6g} "
          f"of the ledger's {summary.ledger_rho:.6g} per user")
    print(f"model: {summary.model_path}; report: {summary.report_path}; ledger run {summary.run_id}; "
          f"{summary.seconds:.1f} s")
    return 0


def add_train_subcommand(subparsers: Any) -> None:
    """Register ``features`` and ``train`` on the ``renyi-stream`` command's subparsers."""
    feat = subparsers.add_parser(
        "features",
        help="curator side: one training row per user (features + label) from the daily indicator files",
        description="Aggregate the daily indicator files per user: per indicator the mean per day and the share "
        "of active days over [--start, --end], and label = 1 if --label-column sums to more than 0 in "
        "[--label-start, --label-end]. Writes Parquet (sensitive: keep it with the ledger). A Beam batch job on "
        "the daily job's read and validation; other options are passed to Beam (e.g. --runner=DataflowRunner "
        "--project ...); one Beam does not know either is refused.",
    )
    feat.add_argument("--input", nargs="+", required=True, help="daily indicator files (Parquet, Arrow IPC, CSV)")
    feat.add_argument("--out", required=True, help="features Parquet file to write")
    feat.add_argument("--start", required=True, help="first day of the feature window (YYYY-MM-DD)")
    feat.add_argument("--end", required=True, help="last day of the feature window (YYYY-MM-DD)")
    feat.add_argument("--label-column", required=True, help="indicator whose later presence is the label")
    feat.add_argument("--label-start", required=True, help="first day of the label window (YYYY-MM-DD)")
    feat.add_argument("--label-end", required=True, help="last day of the label window (YYYY-MM-DD)")
    feat.add_argument("--dead-letters", default=None, metavar="FILE",
                      help="also write the rejected rows there (Parquet, the daily job's dead-letter columns and "
                      "reasons; curator only, 0600)")
    feat.add_argument("--shards", type=int, default=DEFAULT_SHARDS,
                      help=f"groups of users the aggregation is split into (default {DEFAULT_SHARDS})")
    feat.add_argument("--ledger", default=None, metavar="LEDGER",
                      help="read the input contract this ledger records (its id type and number columns); "
                           "or declare one with --id-type/--column/--schema")
    add_contract_options(feat)
    feat.add_argument("--runner", default="DirectRunner", help="Beam runner (default DirectRunner)")
    feat.add_argument("--quiet", action="store_true",
                      help="print no exact count (users, rows read, rejected), only where the features went")
    feat.set_defaults(handler=_features_command)

    train = subparsers.add_parser(
        "train",
        help="private gradient descent (Feldman & Zrnic Alg. 6/7) charged to the ledger's per-user budgets",
        description="Train logistic regression, a one-hidden-layer MLP or Opacus's MNIST CNN with private full-batch gradient "
        "descent. Algorithm 7 (default) clips each user's gradient to what is left of their own budget in the "
        "ledger shared with the daily job, so a user's promise covers daily releases and the model together.",
    )
    train.add_argument("--features", required=True, help="features Parquet (user_id, features, integer label)")
    train.add_argument("--ledger", required=True, help="the curator's ledger (DuckDB), the one the daily job charges; "
                       "one that does not exist is refused (see --new-ledger)")
    train.add_argument("--new-ledger", action="store_true",
                       help="start a new ledger at --ledger when none exists there (this run is its first); without "
                       "it a missing ledger is refused, so a mistyped path never trains on a fresh budget")
    train.add_argument("--epsilon", type=float, required=True, help="per-user epsilon (> 0); must equal the ledger's")
    train.add_argument("--delta", type=float, required=True, help="per-user delta in (0, 1); must equal the ledger's")
    train.add_argument("--out", required=True, help="model file to write (.npz)")
    train.add_argument("--report", default=None, help="training report (JSON; default: --out with .json)")
    train.add_argument("--classes", type=int, default=None, metavar="N",
                       help="number of classes N >= 2 (labels 0..N-1), declared, never read off the labels; default: "
                       "the features file's record (the features job records 2). A row whose label is outside "
                       "them is left out, charged nothing, and counted in the report's curator_only part")
    train.add_argument("--model", choices=("logreg", "mlp", "cnn"), default="logreg",
                       help="default logreg; cnn: Opacus's MNIST convolutional network, for features that are 784 "
                       "pixel columns (a 28x28 image, row-major)")
    train.add_argument("--hidden", type=int, default=64, help="MLP hidden units (default 64)")
    train.add_argument("--clip", type=float, default=1.0, help="C: per-user gradient clip, L2 (default 1)")
    train.add_argument("--steps", type=int, default=50, help="k: full-clip steps, B_norm = k C^2 (default 50)")
    train.add_argument("--learning-rate", type=float, default=1.0, help="eta (default 1)")
    train.add_argument("--noise-multiplier", type=float, default=None,
                       help="sigma (noise std sigma*C on the summed gradient); default: calibrated to the budget")
    train.add_argument("--no-filtering", dest="filtering", action="store_false",
                       help="Algorithm 6 (plain private GD) instead of Algorithm 7")
    train.add_argument("--no-stopping", dest="stopping", action="store_false",
                       help="no Appendix A accuracy queries: stop after k steps")
    train.add_argument("--stop-queries", type=int, default=8, help="Appendix A: accuracy queries (default 8)")
    train.add_argument("--stop-every", type=int, default=5, help="Appendix A: steps between queries (default 5)")
    train.add_argument("--stop-fraction", type=float, default=DEFAULT_STOP_FRACTION,
                       help=f"share of the training budget for the queries (default {DEFAULT_STOP_FRACTION})")
    train.add_argument("--train-rho", type=float, default=None, metavar="RHO",
                       help="required: the zCDP per user this run may charge, declared (> 0, at most the ledger's "
                       "budget kappa; users with less left are charged what they have left). No default: never "
                       "the whole remaining budget")
    train.add_argument("--accounting", choices=ACCOUNTINGS, default=None,
                       help="default: the ledger's (gdp on a new ledger)")
    train.add_argument("--norm-budget", type=float, default=1.0,
                       help="new ledger only: the B later daily jobs on it must use (default 1)")
    train.add_argument("--noise-key", "--key", dest="key", default=None,
                       help="the ledger's noise key file (default: beside the ledger, <ledger>.noise.key); --key is "
                       "the same option (its former name), as in renyi-stream run")
    train.add_argument("--normaliser", type=float, default=None,
                       help="a public number of users to divide the update by, declared by the curator (not "
                       "computed from the data); default: a noisy user count charged to the ledger")
    train.add_argument("--count-fraction", type=float, default=DEFAULT_COUNT_FRACTION,
                       help=f"share of the training budget for that noisy count (default {DEFAULT_COUNT_FRACTION})")
    train.add_argument("--seed", type=int, default=None, help="reproducible noise: NOT private (warns)")
    train.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="gpu needs CuPy")
    train.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="default float64")
    train.add_argument("--quiet", action="store_true", help="no progress lines (nothing printed carries an exact "
                       "count, with or without --quiet)")
    train.set_defaults(handler=_train_command)
