"""The declared input contract is public: the release store records it for analysts (issue 28)."""

from __future__ import annotations

import json

from pipelines.cli.main import main


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
