"""The declared input contract (stream/contract.py): what it accepts, how it is written, what it refuses."""

from __future__ import annotations

import argparse
import json

import pytest

from renyi_stream.pipelines.beam.job_options import add_ledger_options, declared_contract
from renyi_stream.stream.contract import ContractError, DeclaredColumn, InputContract

OPENED = DeclaredColumn("opened", "number", 0.0, 1.0)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_ledger_options(parser, key_help="key")
    return parser.parse_args(["--start", "2026-03-01", "--end", "2026-03-02", "--epsilon", "1", "--delta", "1e-6",
                              "--norm-budget", "2", *argv])


def test_options_declare_bounded_and_unbounded_numbers_and_categories_in_order():
    contract = InputContract.from_options(id_type="string", columns=["opened=0:1", "minutes", "spent=-5:2.5e3"],
                                          categories=["tier"])
    assert contract.names == ("opened", "minutes", "spent", "tier")
    assert contract.numeric == ("opened", "minutes", "spent") and contract.categories == ("tier",)
    assert [(c.name, c.lo, c.hi) for c in contract.bounded] == [("opened", 0.0, 1.0), ("spent", -5.0, 2500.0)]


@pytest.mark.parametrize("text", ["opened=1", "opened=0:x", "opened=1:0", "opened=0:0", "opened=nan:1",
                                  "opened=0:inf", "=0:1"])
def test_a_malformed_column_option_is_refused_naming_it(text):
    with pytest.raises(ContractError, match="opened|name|column"):
        InputContract.from_options(id_type="int64", columns=[text])


def test_a_column_needs_an_id_type_beside_it():
    with pytest.raises(ContractError, match="--id-type is required"):
        InputContract.from_options(id_type=None, columns=["opened=0:1"])


@pytest.mark.parametrize("bad", [dict(id_type="uuid", columns=(OPENED,)), dict(id_type="int64", columns=()),
                                 dict(id_type="int64", columns=(OPENED, OPENED))])
def test_a_contract_refuses_an_unknown_id_type_no_columns_and_a_repeated_column(bad):
    with pytest.raises(ContractError):
        InputContract(**bad)


@pytest.mark.parametrize("name", ["user_id", "day", "event_time", "window_id"])
def test_a_key_column_is_never_an_indicator(name):
    with pytest.raises(ContractError, match="reserved"):
        DeclaredColumn(name)


def test_a_category_has_no_bound():
    with pytest.raises(ContractError, match="only a number column has a bound"):
        DeclaredColumn("tier", "category", 0.0, 1.0)


def test_the_json_text_is_canonical_and_round_trips():
    contract = InputContract("int64", (OPENED, DeclaredColumn("tier", "category"), DeclaredColumn("minutes")))
    again = InputContract.from_json(json.dumps(json.loads(contract.to_json()), indent=4))
    assert again == contract and again.to_json() == contract.to_json()
    assert InputContract.from_columns_json("int64", contract.columns_json()) == contract


def test_a_schema_file_declares_the_same_contract_as_the_options(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text('{"id_type": "int64", "columns": [{"name": "opened", "lo": 0, "hi": 1}, '
                    '{"name": "tier", "kind": "category"}]}')
    assert declared_contract(_args("--schema", str(path))) == \
        declared_contract(_args("--id-type", "int64", "--column", "opened=0:1", "--category", "tier"))


@pytest.mark.parametrize("text, match", [("not json", "is not JSON"), ('{"id_type": "int64"}', "list 'columns'"),
                                         ('{"id_type": "int64", "columns": [{"name": "a", "colour": 1}]}', "each column"),
                                         ('{"id_type": "int64", "columns": [{"name": "a", "lo": 2, "hi": 1}]}', "lo < hi")])
def test_a_malformed_schema_file_is_refused_naming_the_file_and_the_fault(tmp_path, text, match):
    path = tmp_path / "schema.json"
    path.write_text(text)
    with pytest.raises(ContractError, match=match) as caught:
        InputContract.from_file(path)
    assert str(path) in str(caught.value)


def test_a_schema_file_and_inline_options_together_are_refused(tmp_path):
    with pytest.raises(ContractError, match="either as --schema FILE or as"):
        declared_contract(_args("--schema", str(tmp_path / "s.json"), "--column", "opened=0:1"))


def test_no_contract_options_declare_no_contract():
    assert declared_contract(_args()) is None


def test_refusing_an_unbounded_default_names_the_column_and_the_option():
    contract = InputContract("int64", (OPENED, DeclaredColumn("minutes")))
    contract.refuse_unbounded(["opened"])  # bounded: nothing to refuse
    with pytest.raises(ContractError, match=r"\['minutes'\].*--column minutes=0:60"):
        contract.refuse_unbounded(["opened", "minutes"])


def test_a_bound_of_negative_zero_is_the_bound_zero():
    # -0.0 == 0.0, but its text differed: a ledger declared with 0:1 refused a run declaring -0:1.
    assert InputContract.from_options(id_type="int64", columns=["opened=-0:1"]).to_json() == \
        InputContract.from_options(id_type="int64", columns=["opened=0:1"]).to_json()
    assert DeclaredColumn("spent", "number", -5.0, -0.0).to_dict()["hi"] == 0.0
    assert json.dumps(DeclaredColumn("spent", "number", -5.0, -0.0).to_dict()["hi"]) == "0.0"


@pytest.mark.parametrize("text, match", [
    ('{"id_type": "int64", "columns": [{"name": "opened", "lo": 0, "hi": 1' + "0" * 400 + '}]}', "finite"),
    ('{"id_type": "int64", "id_type": "string", "columns": [{"name": "opened"}]}', "id_type.*more than once"),
    ('{"id_type": "int64", "columns": [{"name": "opened", "lo": 0, "hi": 1, "hi": 5}]}', "hi.*more than once"),
])
def test_a_schema_file_with_a_huge_integer_or_a_repeated_key_is_refused_as_a_contract_error(tmp_path, text, match):
    # A 400-digit integer raised OverflowError (a traceback); a repeated key silently took its last value.
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(ContractError, match=match):
        InputContract.from_file(tmp_path / "s.json")
