"""The declared input contract is public: the release store records it for analysts (issue 28)."""

from __future__ import annotations

import json

import pytest

from renyi_stream.pipelines.cli.main import main


def test_the_release_store_records_the_ledgers_declared_contract_for_analysts(tmp_path, capsys):
    day = tmp_path / "d.csv"
    day.write_text("user_id,day,opened,minutes\n1,2026-03-01,1,7\n")
    assert main(["run", "--input", str(day), "--store", str(tmp_path / "s.duckdb"), "--ledger", str(tmp_path / "l.duckdb"),
                 "--start", "2026-03-01", "--end", "2026-03-01", "--epsilon", "1", "--delta", "1e-6",
                 "--norm-budget", "4", "--id-type", "int64", "--column", "opened=0:1", "--column", "minutes"]) == 0
    capsys.readouterr()
    assert main(["sql", "SELECT value FROM store_meta WHERE key = 'input_contract'", "--store",
                 str(tmp_path / "s.duckdb"), "--format", "json"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()  # one JSON object per row
    row = json.loads(line)
    assert json.loads(row["value"]) == {"id_type": "int64", "columns": [
        {"name": "opened", "kind": "number", "lo": 0.0, "hi": 1.0}, {"name": "minutes", "kind": "number"}]}


# --- beside a Parquet release root (the distributed and streaming jobs; the attacker's finding G) -----

DAY = "2026-03-01"
DECLARE = ("--id-type", "int64", "--column", "opened=0:1", "--column", "minutes")
DECLARED = {"id_type": "int64", "columns": [{"name": "opened", "kind": "number", "lo": 0.0, "hi": 1.0},
                                            {"name": "minutes", "kind": "number"}]}


def _day_csv(tmp_path, day: str = DAY) -> str:
    path = tmp_path / f"{day}.csv"
    path.write_text(f"user_id,day,opened,minutes\n1,{day},1,7\n2,{day},0,3\n")
    return str(path)


def _key(tmp_path) -> str:
    from renyi_stream.stream.noise import NoiseKey

    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    return str(key)


def _distributed(tmp_path, *declare: str, day: str = DAY, previous: str = "none", out: str = "run0") -> int:
    from renyi_stream.pipelines.distributed import job as dist

    return dist.main(["--input", _day_csv(tmp_path, day), "--start", day, "--end", day, "--epsilon", "1",
                      "--delta", "1e-6", "--norm-budget", "8", "--previous-ledger", previous,
                      "--output", str(tmp_path / out), "--releases-parquet", str(tmp_path / "public"),
                      "--noise-key", _key(tmp_path), "--shards", "2", "--quiet", *declare])


def _streaming(tmp_path, *declare: str) -> int:
    import pyarrow as pa

    from renyi_stream.pipelines.streaming.beam import job as sj
    from renyi_stream.pipelines.streaming.codec import encode_message
    from renyi_stream.stream.engine.readers import read_batches

    message = tmp_path / "d0.arrows"
    message.write_bytes(encode_message(pa.Table.from_batches(list(read_batches(_day_csv(tmp_path))))))
    return sj.main(["--replay", str(message), "--start", DAY, "--end", DAY, "--epsilon", "1", "--delta", "1e-6",
                    "--norm-budget", "8", "--releases-parquet", str(tmp_path / "public"), "--noise-key",
                    _key(tmp_path), "--shards", "2", "--output", str(tmp_path / "curator"), *declare])


def _recorded(tmp_path):
    from renyi_stream.queries.catalogue import ReleaseCatalogue

    return ReleaseCatalogue(str(tmp_path / "public")).input_contract()


def _contract_file(tmp_path):
    from renyi_stream.queries.catalogue import CONTRACT_FILE, FOLDER

    return tmp_path / "public" / FOLDER / CONTRACT_FILE


def test_the_distributed_jobs_first_run_records_the_declared_contract_beside_its_parquet_releases(tmp_path):
    assert _distributed(tmp_path, *DECLARE) == 0
    assert json.loads(_recorded(tmp_path).to_json()) == DECLARED
    assert json.loads(_contract_file(tmp_path).read_text()) == DECLARED  # a public file analysts can read as is


def test_the_streaming_jobs_first_run_records_the_declared_contract_beside_its_parquet_releases(tmp_path):
    assert _streaming(tmp_path, *DECLARE) == 0
    assert json.loads(_recorded(tmp_path).to_json()) == DECLARED


def test_a_later_run_of_the_same_ledger_leaves_the_recorded_contract_as_it_is(tmp_path):
    assert _distributed(tmp_path, *DECLARE) == 0
    before = _contract_file(tmp_path).stat()
    assert _distributed(tmp_path, day="2026-03-02", previous=str(tmp_path / "run0"), out="run1") == 0
    after = _contract_file(tmp_path).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json.loads(_recorded(tmp_path).to_json()) == DECLARED


def test_a_root_records_a_contract_once_and_refuses_another_naming_both(tmp_path):
    from renyi_stream.queries.catalogue import ReleaseCatalogue
    from renyi_stream.stream.contract import ContractError, InputContract

    catalogue = ReleaseCatalogue(str(tmp_path / "public"))
    declared = InputContract.from_dict(DECLARED)
    other = InputContract.from_options(id_type="int64", columns=["opened=0:2"])
    assert catalogue.input_contract() is None
    assert catalogue.record_input_contract(declared) is True
    assert catalogue.record_input_contract(declared) is False
    _answer_a_window(tmp_path / "public")
    with pytest.raises(ContractError, match="records the input contract") as refused:
        catalogue.record_input_contract(other)
    assert declared.to_json() in str(refused.value) and other.to_json() in str(refused.value)
    assert catalogue.input_contract() == declared


def _answer_a_window(root) -> None:
    from renyi_stream.queries.release_files import write_release_file
    from renyi_stream.queries.release_store import RELEASE_SCHEMA

    write_release_file(str(root), 1, RELEASE_SCHEMA.empty_table())


def test_a_contract_recorded_by_a_first_run_that_answered_nothing_is_replaced_by_the_next(tmp_path):
    # A first run refused after it recorded its contract (an idle input, say) left a root that
    # nothing answers to, locked to that contract: a corrected first run was refused for good
    # (the attacker's second review, finding 6).
    from renyi_stream.queries.catalogue import ReleaseCatalogue
    from renyi_stream.stream.contract import InputContract

    catalogue = ReleaseCatalogue(str(tmp_path / "public"))
    catalogue.record_input_contract(InputContract.from_options(id_type="int64", columns=["opened=0:1"]))
    corrected = InputContract.from_options(id_type="int64", columns=["opened=0:5"])
    catalogue.check_input_contract(corrected)
    assert catalogue.record_input_contract(corrected) is True
    assert catalogue.input_contract() == corrected


@pytest.mark.parametrize("job", [_distributed, _streaming], ids=["distributed", "streaming"])
def test_a_job_whose_ledger_declares_another_contract_than_the_roots_is_refused_before_anyone_is_charged(
        tmp_path, capsys, job):
    from renyi_stream.queries.catalogue import ReleaseCatalogue
    from renyi_stream.stream.contract import InputContract

    earlier = InputContract.from_options(id_type="string", columns=["opened=0:2"])
    ReleaseCatalogue(str(tmp_path / "public")).record_input_contract(earlier)
    claims = tmp_path / "public" / "_lineage" / "after"
    claims.mkdir(parents=True)
    (claims / "origin.json").write_text('{"version": 1, "previous_run": "origin", "run": "another"}')
    # A root answered by a run (its lineage claim) under another contract: the launch refuses it,
    # by the contract check or, first, by the lineage check (a new ledger cannot continue a root
    # another ledger answers); the contract's own refusal, naming both, is tested on the catalogue.
    assert job(tmp_path, *DECLARE) == 2
    assert "refused" in capsys.readouterr().err
    assert not [p for p in tmp_path.rglob("*.parquet")]  # nothing charged, nothing released


def test_renyi_stream_query_contract_prints_the_contract_of_a_parquet_release_root(tmp_path, capsys):
    assert _distributed(tmp_path, *DECLARE) == 0
    capsys.readouterr()
    assert main(["query", "contract", "--releases-parquet", str(tmp_path / "public")]) == 0
    assert json.loads(capsys.readouterr().out) == DECLARED


def test_renyi_stream_query_contract_prints_the_contract_of_a_release_store(tmp_path, capsys):
    day = _day_csv(tmp_path)
    assert main(["run", "--input", day, "--store", str(tmp_path / "s.duckdb"), "--ledger", str(tmp_path / "l.duckdb"),
                 "--start", DAY, "--end", DAY, "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4",
                 *DECLARE]) == 0
    capsys.readouterr()
    assert main(["query", "contract", "--store", str(tmp_path / "s.duckdb")]) == 0
    assert json.loads(capsys.readouterr().out) == DECLARED


def test_renyi_stream_query_contract_says_when_none_is_recorded(tmp_path, capsys):
    (tmp_path / "public").mkdir()
    assert main(["query", "contract", "--releases-parquet", str(tmp_path / "public")]) == 1
    assert "records no input contract" in capsys.readouterr().err
