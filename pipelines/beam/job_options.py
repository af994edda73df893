"""What the distributed and streaming jobs share at launch: the one option group for the promise,
the schedule, the key, the shards and the window (:func:`add_promise_options`), parsing those
options, the worker noise key's fingerprint, and continuing a recorded ledger budget. Anything
that would break a promise, or cannot be checked not to, is refused before launch
(:class:`RunRefused`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipelines.beam import worker_key
from stream.accounting import Calibration, resume
from stream.noise import NoiseKey
from stream.schema import WindowSpec

DEFAULT_SHARDS = 256
WORKER_KEY_DIR = "/tmp/renyi-stream-key"


class RunRefused(RuntimeError):
    """A run that would break a promise (or cannot be checked not to) is refused before launch."""


#: Parameters a ledger is started with; every later run must match them (as the local job's).
FIXED = ("epsilon", "delta", "norm_budget", "accounting", "rho", "noise_std", "tracker_step", "id_type",
         "key_fingerprint", "window_seconds", "origin_seconds")


#: The part of :data:`FIXED` that calibration derives from the promise: a continued ledger keeps
#: its recorded values (:func:`continue_budget`), so another version's last-bit difference in the
#: root finder neither refuses it nor changes its noise.
DERIVED = ("rho", "noise_std", "tracker_step")


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


def continue_budget(cal: Calibration, parameters: dict[str, Any], recorded_rho: Any,
                    *, where: str) -> tuple[Calibration, dict[str, Any]]:
    """This run's calibration and :data:`FIXED` values when it continues a ledger whose budget is
    ``recorded_rho``: the ledger's budget and the noise std and tracker step it gives
    (:func:`stream.accounting.calibration.resume`). RunRefused, naming ``where``, when the
    recorded budget is missing or above what this run's promise allows. The promise itself must
    already have been checked equal."""
    if not isinstance(recorded_rho, (int, float)) or isinstance(recorded_rho, bool):
        raise RunRefused(f"{where} records no zCDP budget (rho={recorded_rho!r}): it cannot be continued")
    try:
        kept = resume(cal, float(recorded_rho))
    except ValueError as exc:
        raise RunRefused(f"{where}: its ledger's budget does not keep this run's promise: {exc}") from None
    return kept, {**parameters, "rho": kept.rho, "noise_std": kept.noise_std, "tracker_step": kept.rho / 32.0}


def add_promise_options(parser: argparse.ArgumentParser) -> None:
    """The options every entry point shares: the public schedule, the promise, the public
    release root, the noise key, and how the filter runs."""
    arg = parser.add_argument
    arg("--start", required=True, help="first window of the public schedule (YYYY-MM-DD)")
    arg("--end", required=True, help="last window of the public schedule (YYYY-MM-DD)")
    arg("--epsilon", type=float, required=True, help="per-user epsilon (> 0)")
    arg("--delta", type=float, required=True, help="per-user delta, in (0, 1)")
    arg("--norm-budget", "--norm_budget", dest="norm_budget", type=float, required=True,
        help="B, squared-norm budget per user (> 0)")
    arg("--releases-parquet", "--releases_parquet", dest="releases_parquet", required=True,
        help="public release root: <root>/window_id=<id>/releases.parquet")
    arg("--noise-key", "--noise_key", dest="noise_key", help="noise key file, at this path on every worker")
    arg("--noise-key-secret", "--noise_key_secret", dest="noise_key_secret",
        help="Secret Manager version of the noise key (projects/P/secrets/S/versions/V), fetched by each worker")
    arg("--key-fingerprint", "--key_fingerprint", dest="key_fingerprint",
        help="the key's public fingerprint, when the launcher cannot (or should not) read the key")
    arg("--window", default="1d", help="window length: 1d (default), 12h, 30m, 3600s")
    arg("--policy", choices=["drop", "clip"], default="drop")
    arg("--accounting", choices=["gdp", "zcdp-cks", "zcdp-thm49"], default="gdp")
    arg("--shards", type=int, default=DEFAULT_SHARDS, help=f"user shards of the filter (default {DEFAULT_SHARDS})")
