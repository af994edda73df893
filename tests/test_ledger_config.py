"""The configuration a ledger keeps for life (stream/engine/ledger_config.py, issue 19): one record,
one continuation check, one codec per place a job stores it (a real DuckDB ledger, JSON, a real
Parquet file), the tracker step's one definition, and the one option group of the three jobs."""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from renyi_stream.stream.contract import DeclaredColumn, InputContract
from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.accounting.calibration import NOISE_HEADROOM
from renyi_stream.stream.accounting.odometers import tracker_step_for
from renyi_stream.stream.engine.ledger_config import (DEFAULT_SHARDS, DERIVED, FIXED, MAX_SHARDS, LedgerConfig, LedgerConfigError,
                                         snapshot_key)
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import new_ledger_id
from renyi_stream.stream.schema import WindowSpec

ROOT = Path(__file__).resolve().parents[1]
B = 30.0
FINGERPRINT = "0123456789abcdef"


def _config(*, epsilon=0.1 + 0.2, delta=1e-6 / 3, norm_budget=B, accounting="gdp", id_type="int64",
            key_fingerprint=FINGERPRINT, window_seconds=86_400, origin_seconds=0, n_shards=DEFAULT_SHARDS,
            ledger_id="0123456789abcdef0123456789abcdef", releases=None, contract=None) -> LedgerConfig:
    """A new ledger's configuration; floats that only an exact codec keeps (0.1 + 0.2, 1e-6 / 3)."""
    return LedgerConfig.from_promise(
        epsilon=epsilon, delta=delta, norm_budget=norm_budget, accounting=accounting, id_type=id_type,
        key_fingerprint=key_fingerprint, window=WindowSpec(length_seconds=window_seconds, origin_seconds=origin_seconds),
        n_shards=n_shards, ledger_id=ledger_id, releases=releases,
        contract=None if contract is None else InputContract(id_type, contract))


def _as_another_version(config: LedgerConfig, rho_factor: float) -> LedgerConfig:
    """``config`` as a version whose calibration ends elsewhere records it: the budget scaled by
    ``rho_factor``, with the noise std (Corollary 4.7, with headroom) and tracker step it gives."""
    rho = config.rho * rho_factor
    return replace(config, rho=rho, noise_std=math.sqrt(config.norm_budget / (2 * rho)) * (1 + NOISE_HEADROOM),
                   tracker_step=rho / 32)


# --- a new ledger's configuration ---------------------------------------------------------------------


def test_a_new_ledgers_budget_noise_and_tracker_step_come_from_the_calibration_of_its_promise():
    config = _config()
    cal = calibrate(epsilon=0.1 + 0.2, delta=1e-6 / 3, norm_budget=B, accounting="gdp")
    assert (config.rho, config.noise_std) == (cal.rho, cal.noise_std)
    assert config.tracker_step == tracker_step_for(cal.rho) == cal.rho / 32
    assert config.window == WindowSpec() and config.n_shards == DEFAULT_SHARDS == 16
    assert config.empty_ledger().tracker_step == config.tracker_step


def test_the_tracker_step_is_written_once_in_the_code_base():
    # tracker_step = rho / 32 is defined by renyi_stream.stream.accounting.odometers.tracker_step_for alone; any
    # other "/ 32" in the code is a second definition that can drift from it.
    pattern = re.compile(r"/\s*32(\.0*)?(?![\d.])")
    definition = ROOT / "stream" / "accounting" / "odometers.py"
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for package in ("stream", "pipelines", "queries", "deploy", "benchmarks")
            for path in sorted((ROOT / package).rglob("*.py")) if path != definition
            for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
    assert Ledger(budget=0.7).tracker_step == tracker_step_for(0.7)


@pytest.mark.parametrize("field, value", [
    ("epsilon", 0.0), ("delta", 1.0), ("norm_budget", -1.0), ("accounting", "rdp"), ("rho", float("nan")),
    ("noise_std", 0.0), ("tracker_step", -1.0), ("id_type", "uuid"), ("key_fingerprint", "XYZ"),
    ("window_seconds", 0), ("origin_seconds", 2**62), ("n_shards", 0), ("n_shards", MAX_SHARDS + 1),
    ("n_shards", 2.5), ("ledger_id", "abc"), ("releases", ""),
])
def test_a_field_out_of_range_is_refused_at_construction_naming_it_and_its_value(field, value):
    with pytest.raises(ValueError, match=rf"{field} must .*got {re.escape(field)}={re.escape(repr(value))}"):
        replace(_config(), **{field: value})


# --- one codec per place a ledger is recorded: round trips through the real storage ----------------------


@pytest.mark.parametrize("releases", [None, "gs://acme-public/releases"])
def test_the_manifest_codec_round_trips_through_json(releases):
    config = _config(releases=releases, n_shards=256)
    assert LedgerConfig.from_manifest(json.loads(json.dumps(config.to_manifest())), where="m") == config


def test_the_snapshot_codec_round_trips_through_a_parquet_files_schema_metadata(tmp_path):
    config = _config(releases="gs://acme-public/releases", n_shards=3)
    table = config.empty_ledger().to_arrow()
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, **config.to_snapshot_metadata()}),
                   tmp_path / "s.parquet")
    metadata = pq.read_schema(tmp_path / "s.parquet").metadata
    assert LedgerConfig.from_snapshot_metadata(metadata, where="s") == config
    Ledger.from_arrow(pq.read_table(tmp_path / "s.parquet"))  # the ledger's own metadata is untouched


def test_the_meta_codec_round_trips_through_a_curator_ledger_file(tmp_path):
    from renyi_stream.pipelines.curator.store import CuratorStore

    with CuratorStore(tmp_path / "l.duckdb") as store:
        config = _config(ledger_id=store.ledger_id, n_shards=5)
        assert store.check_or_record_parameters(config) == config
    with CuratorStore(tmp_path / "l.duckdb") as store:
        assert store.parameters() == config
    assert LedgerConfig.from_meta(config.to_meta(), where="l") == config


# --- records written before a field existed are read as the jobs always read them ----------------------


def test_meta_rows_without_a_budget_record_no_ledger_yet_and_without_an_id_predate_ledger_ids():
    assert LedgerConfig.from_meta({"schema_version": "1", "ledger_id": new_ledger_id()}, where="l") is None
    rows = _config().to_meta()
    del rows["ledger_id"]
    assert LedgerConfig.from_meta(rows, where="l") == replace(_config(), ledger_id=None)


def test_meta_rows_missing_a_parameter_are_refused_naming_it_and_the_ledger():
    rows = _config().to_meta()
    del rows["delta"]
    with pytest.raises(LedgerConfigError, match=r"the ledger l\.duckdb records no delta"):
        LedgerConfig.from_meta(rows, where="the ledger l.duckdb")


def test_a_manifest_from_before_ledger_ids_and_release_roots_reads_as_recording_neither():
    recorded = _config(releases="gs://r").to_manifest()
    del recorded["parameters"]["ledger_id"]
    del recorded["releases"]
    assert LedgerConfig.from_manifest(recorded, where="m") == replace(_config(releases=None), ledger_id=None)


def test_a_snapshot_from_before_ledger_ids_and_shard_counts_takes_the_shards_found():
    metadata = _config(releases="/public").to_snapshot_metadata()
    del metadata[snapshot_key("ledger_id").encode()], metadata[snapshot_key("n_shards").encode()]
    config = LedgerConfig.from_snapshot_metadata(metadata, where="s", n_shards=3)
    assert config.ledger_id is None and config.n_shards == 3


def test_a_snapshot_from_before_the_job_recorded_its_parameters_says_which_it_lacks():
    metadata = {k: v for k, v in _config(releases="/public").to_snapshot_metadata().items()
                if k.decode()[len("renyi_stream."):] not in (*FIXED, *DERIVED)}
    with pytest.raises(LedgerConfigError) as caught:
        LedgerConfig.from_snapshot_metadata(metadata, where="s")
    assert set(caught.value.missing) == {*FIXED, *DERIVED} - {"columns"}  # a record may predate declarations


def test_a_snapshot_whose_budget_is_not_a_number_records_no_budget():
    metadata = {**_config(releases="/public").to_snapshot_metadata(), snapshot_key("rho").encode(): b"lots"}
    with pytest.raises(LedgerConfigError, match=r"s records no zCDP budget \(rho='lots'\)") as caught:
        LedgerConfig.from_snapshot_metadata(metadata, where="s")
    assert caught.value.missing == ()


# --- the continuation check ------------------------------------------------------------------------------

CHANGES = {  # a fixed field -> another value a run might ask
    "epsilon": {"epsilon": 0.5}, "delta": {"delta": 2e-6}, "norm_budget": {"norm_budget": 31.0},
    "accounting": {"accounting": "zcdp-cks"}, "id_type": {"id_type": "string"},
    "key_fingerprint": {"key_fingerprint": "fedcba9876543210"}, "window_seconds": {"window_seconds": 43_200},
    "origin_seconds": {"origin_seconds": 3_600}, "releases": {"releases": "gs://acme-staging/releases"},
    "columns": {"contract": (DeclaredColumn("opened", "number", 0.0, 2.0),)},
}
DECLARED = (DeclaredColumn("opened", "number", 0.0, 1.0), DeclaredColumn("tier", "category"))


def test_every_fixed_field_has_a_change_case():
    assert set(CHANGES) == set(FIXED)


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_a_run_asking_another_value_of_a_fixed_field_is_refused_naming_the_field_both_values_and_where(field):
    recorded = _config(releases="gs://acme-public/releases", contract=DECLARED)
    asked = _config(**{"releases": "gs://acme-public/releases", "contract": DECLARED, **CHANGES[field]})
    with pytest.raises(LedgerConfigError) as caught:
        asked.continued_from(recorded, where="--previous-ledger gs://c/run1")
    message = str(caught.value)
    assert message.startswith("--previous-ledger gs://c/run1: ")
    assert f"{field}: ledger has {getattr(recorded, field)!r}, this run asks {getattr(asked, field)!r}" in message
    assert len(caught.value.details) == 1
    assert "parameters differ from the ledger's" in message and "change every user's promise" in message


def test_a_record_without_a_release_root_is_continued_into_this_runs_root_and_a_job_without_one_keeps_the_records():
    assert _config(releases="gs://r").continued_from(_config(), where="w").releases == "gs://r"
    assert _config().continued_from(_config(releases="gs://r"), where="w").releases == "gs://r"


def test_a_record_without_declared_columns_is_continued_with_this_runs_and_a_run_declaring_none_keeps_the_records():
    assert _config(contract=DECLARED).continued_from(_config(), where="w").contract == InputContract("int64", DECLARED)
    assert _config().continued_from(_config(contract=DECLARED), where="w").contract == InputContract("int64", DECLARED)
    assert _config().continued_from(_config(), where="w").contract is None


@pytest.mark.parametrize("codec", ["meta", "manifest", "snapshot"])
def test_every_record_keeps_the_declared_columns_exactly(codec):
    config = _config(releases="/public", contract=DECLARED)
    if codec == "meta":
        back = LedgerConfig.from_meta(config.to_meta(), where="m")
    elif codec == "manifest":
        back = LedgerConfig.from_manifest(json.loads(json.dumps(config.to_manifest())), where="m")
    else:
        back = LedgerConfig.from_snapshot_metadata(config.to_snapshot_metadata(), where="m")
    assert back.contract == InputContract("int64", DECLARED) and back.columns == config.columns


def test_an_edited_declaration_in_a_record_is_refused_naming_it():
    rows = {**_config(contract=DECLARED).to_meta(), "columns": '[{"name": "opened", "kind": "number", "lo": 1, "hi": 0}]'}
    with pytest.raises(LedgerConfigError, match="needs lo < hi"):
        LedgerConfig.from_meta(rows, where="m")


def test_a_continuing_run_keeps_the_recorded_budget_noise_and_tracker_step_of_another_versions_last_bits():
    asked = _config()
    recorded = _as_another_version(asked, 1 - 3e-14)
    continued = asked.continued_from(recorded, where="w")
    assert {k: getattr(continued, k) for k in DERIVED} == {k: getattr(recorded, k) for k in DERIVED}
    assert continued.noise_std != asked.noise_std  # this version's calibration would have drawn other noise


def test_a_recorded_budget_above_the_promise_is_refused_naming_rho():
    with pytest.raises(LedgerConfigError, match=r"w: rho: ledger has .*budget does not keep this run's promise: "
                                                r"recorded_rho must be at most"):
        _config().continued_from(_as_another_version(_config(), 1 + 1e-9), where="w")


@pytest.mark.parametrize("field", ["noise_std", "tracker_step"])
def test_a_recorded_noise_or_tracker_step_that_does_not_follow_from_its_budget_is_refused_as_edited(field):
    recorded = _config()
    recorded = replace(recorded, **{field: getattr(recorded, field) * (1 + 1e-15)})
    with pytest.raises(LedgerConfigError, match=rf"{field}: ledger has .*the ledger was edited"):
        _config().continued_from(recorded, where="w")


def test_the_ledger_keeps_its_recorded_id_and_a_record_from_before_ids_takes_this_runs():
    recorded, asked = _config(ledger_id=new_ledger_id()), _config(ledger_id=new_ledger_id())
    assert asked.continued_from(recorded, where="w").ledger_id == recorded.ledger_id
    assert asked.continued_from(replace(recorded, ledger_id=None), where="w").ledger_id == asked.ledger_id


def test_a_continuing_run_may_use_another_shard_count():
    assert _config(n_shards=7).continued_from(_config(n_shards=256), where="w").n_shards == 7


def test_who_asks_is_named_as_the_caller_says():
    with pytest.raises(LedgerConfigError) as caught:
        _config(epsilon=2.0).continued_from(_config(epsilon=1.0), where="w", by="this training")
    assert caught.value.details == ("epsilon: ledger has 1.0, this training asks 2.0",)


# --- one option group: the promise, key, shards and window, alike in the three jobs -----------------------

SHARED = ("start", "end", "epsilon", "delta", "norm_budget", "accounting", "window", "noise_key", "policy", "shards")


def _subcommand(name: str) -> argparse.ArgumentParser:
    from renyi_stream.pipelines.cli.main import _build_parser

    parser = _build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def _jobs() -> dict[str, argparse.ArgumentParser]:
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.pipelines.streaming.options import _parser

    return {"renyi-stream run": _subcommand("run"), "python -m renyi_stream.pipelines.distributed": dist._parser(),
            "python -m renyi_stream.pipelines.streaming": _parser()}


def test_the_three_jobs_share_the_ledger_options_with_the_same_names_defaults_and_choices():
    described = {}
    for job, parser in _jobs().items():
        actions = {a.dest: a for a in parser._actions}
        described[job] = {dest: (tuple(s for s in actions[dest].option_strings if s != "--key"), actions[dest].default,
                                 tuple(actions[dest].choices or ()), actions[dest].type, actions[dest].required)
                          for dest in SHARED}
    first, *others = described.values()
    for job, options in described.items():
        assert options == first, {d: (options[d], first[d]) for d in SHARED if options[d] != first[d]}
    assert first["shards"][1] == DEFAULT_SHARDS and first["noise_key"][0][0] == "--noise-key"


def test_run_and_train_still_accept_key_for_the_noise_key():
    assert _subcommand("run").parse_known_args(
        ["--input", "i", "--store", "s", "--ledger", "l", "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "1",
         "--start", "2026-03-01", "--end", "2026-03-01", "--key", "k.key"])[0].noise_key == "k.key"
    assert _subcommand("train").parse_args(
        ["--features", "f", "--ledger", "l", "--epsilon", "1", "--delta", "1e-6", "--out", "m", "--key",
         "k.key"]).key == "k.key"
