"""Bounds on what an analyst can register as a running query (issue 28, item 5): a horizon per
strategy and the numbers kept a user, alone and for the running queries active together,
refused at registration (Python API, both catalogues, the command line) naming the parameter, its
value, the allowed range and the way out. The refusals at a job's launch are in
tests/test_running_strategy.py (daily job) and tests/test_job_parity.py (distributed job)."""

from __future__ import annotations

import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.daily.job import JobConfig
from renyi_stream.queries.catalogue import ReleaseCatalogue
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.stream.accounting.gaussian import MAX_DIM
from renyi_stream.stream.continual.prepaid import (
    MAX_RUNNING_HORIZON,
    MAX_USER_STATE,
    RUNNING_STRATEGIES,
    running_footprint,
    running_rule,
)

W0 = 20513


def _running(query_id: str = "r", *, strategy: str, horizon=None, dim: int = 1) -> LinearQuery:
    if dim == 1:
        return LinearQuery.columns(query_id, ["x"], kind="running", strategy=strategy, horizon=horizon)
    return LinearQuery.histogram(query_id, "tier", list(range(dim)), kind="running", strategy=strategy,
                                 horizon=horizon)


class _Catalogue:
    """The DuckDB registry or the Parquet catalogue, through their ``add``."""

    def __init__(self, kind: str, tmp_path) -> None:
        self.kind = kind
        self._registry = QueryRegistry(tmp_path / "s.duckdb") if kind == "duckdb" else None
        self._catalogue = ReleaseCatalogue(str(tmp_path / "public")) if kind == "parquet" else None

    def add(self, query: LinearQuery, first: int = W0) -> None:
        (self._registry or self._catalogue).add(query, effective_from=first)

    def retire(self, query_id: str, first: int) -> None:
        (self._registry or self._catalogue).retire(query_id, from_window=first)

    def ids(self) -> list[str]:
        return [q.query_id for q, _, _ in (self._registry or self._catalogue).plan(0, 10 ** 6)]


@pytest.fixture(params=["duckdb", "parquet"])
def catalogue(request, tmp_path):
    found = _Catalogue(request.param, tmp_path)
    yield found
    if found._registry is not None:
        found._registry.close()


# --- the Python API, both catalogues ------------------------------------------------------------


def test_sqrt_above_its_horizon_bound_is_refused_at_registration_naming_horizon_and_the_bound(catalogue):
    with pytest.raises(ValueError, match=r"horizon must be in \[1, 1024\] for strategy 'sqrt'.*got horizon=16384") \
            as refused:
        catalogue.add(_running(strategy="sqrt", horizon=16384))
    assert "--strategy blt" in str(refused.value)
    assert catalogue.ids() == []


@pytest.mark.parametrize("strategy", RUNNING_STRATEGIES)
def test_the_largest_allowed_horizon_of_every_strategy_is_accepted(catalogue, strategy):
    catalogue.add(_running(strategy=strategy, horizon=MAX_RUNNING_HORIZON[strategy]))
    assert catalogue.ids() == ["r"]


def test_every_strategy_at_the_default_horizon_is_accepted(catalogue):
    for strategy in RUNNING_STRATEGIES:
        catalogue.add(_running(strategy, strategy=strategy))
    catalogue.add(_running("tail", strategy="blt", horizon="tail"))
    assert catalogue.ids() == sorted([*RUNNING_STRATEGIES, "tail"])


def test_a_running_query_whose_per_user_state_is_above_the_bound_is_refused_naming_dim_and_its_range(catalogue):
    # sqrt at 365 windows keeps 365 x dim numbers a user: at most 1024 // 365 = 2 coordinates
    with pytest.raises(ValueError, match=r"dim must be in \[1, 2\] for strategy 'sqrt' over horizon 365.*"
                                         r"got dim=3.*--strategy blt"):
        catalogue.add(_running(strategy="sqrt", dim=3))
    catalogue.add(_running(strategy="sqrt", dim=2))
    assert catalogue.ids() == ["r"]


def test_a_histogram_of_many_categories_is_refused_as_a_running_query_naming_dim(catalogue):
    with pytest.raises(ValueError, match=rf"dim must be in \[1, 113\] for strategy 'tree' over horizon 365.*"
                                         rf"got dim={MAX_DIM}.*--strategy blt"):
        catalogue.add(_running("tree", strategy="tree", dim=MAX_DIM))
    with pytest.raises(ValueError, match=r"dim must be in \[1, 256\] for strategy 'blt'.*got dim=257"):
        catalogue.add(_running("blt", strategy="blt", dim=257))
    catalogue.add(_running("blt", strategy="blt", dim=256))  # 4 x 256 numbers a user: the bound
    catalogue.add(LinearQuery.histogram("window", "tier", list(range(MAX_DIM - 256))))  # a window query: no state
    assert catalogue.ids() == ["blt", "window"]


def test_running_queries_active_together_may_not_keep_more_than_the_bound_a_user(catalogue):
    # two sqrt queries over 365 windows keep 730 numbers a user; a third would make it 1095
    catalogue.add(_running("s0", strategy="sqrt"), first=W0)
    catalogue.add(_running("s1", strategy="sqrt"), first=W0 + 3)
    with pytest.raises(ValueError, match=rf"active together in window {W0 + 3} .* would keep 1095 numbers a user; "
                                         rf"at most {MAX_USER_STATE}.*retire some first"):
        catalogue.add(_running("s2", strategy="sqrt"), first=W0 + 1)
    catalogue.retire("s0", W0 + 5)
    catalogue.add(_running("s2", strategy="sqrt"), first=W0 + 5)  # s0 is never active with it
    assert catalogue.ids() == ["s0", "s1", "s2"]


def test_window_queries_are_not_bounded_by_the_running_bounds(catalogue):
    catalogue.add(LinearQuery.histogram("wide", "tier", list(range(MAX_DIM))))
    assert catalogue.ids() == ["wide"]


# --- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["--store", "--releases-parquet"])
def test_query_add_refuses_sqrt_above_its_horizon_bound_naming_horizon_before_a_store_is_made(tmp_path, capsys,
                                                                                              where):
    target = tmp_path / ("s.duckdb" if where == "--store" else "public")
    with pytest.raises(SystemExit) as exited:
        main(["query", "add", where, str(target), "--id", "big", "--columns", "x", "--kind", "running",
              "--strategy", "sqrt", "--horizon", "16384", "--from", "2026-03-01"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    assert "argument --horizon: horizon must be in [1, 1024] for strategy 'sqrt'" in err and "16384" in err
    assert "--strategy blt" in err
    assert not target.exists()


def test_query_add_takes_sqrt_at_its_largest_horizon(tmp_path):
    store = tmp_path / "s.duckdb"
    assert main(["query", "add", "--store", str(store), "--create", "--id", "long", "--columns", "x", "--kind",
                 "running", "--strategy", "sqrt", "--horizon", "1024", "--from", "2026-03-01"]) == 0
    with QueryRegistry(store, read_only=True) as registry:
        assert (registry.get("long").strategy, registry.get("long").horizon) == ("sqrt", 1024)


def test_run_refuses_default_running_queries_over_a_sqrt_horizon_above_the_bound(tmp_path):
    with pytest.raises(ValueError, match=r"horizon must be in \[1, 1024\] for strategy 'sqrt'"):
        JobConfig(inputs=(str(tmp_path / "in.parquet"),), store=str(tmp_path / "s.duckdb"),
                  ledger=str(tmp_path / "l.duckdb"), epsilon=1.0, delta=1e-5, norm_budget=5.0, start_window=W0,
                  end_window=W0, release="running", strategy="sqrt", horizon="16384")


# --- the footprint the bounds are about -------------------------------------------------------------


@pytest.mark.parametrize("strategy, horizon", [("blt", 365), ("blt", "tail"), ("tree", 365), ("tree", 1000),
                                               ("sqrt", 90)])
def test_the_footprint_is_the_rules_own_width_and_releases(strategy, horizon):
    rule = running_rule(strategy, horizon)
    found = running_footprint(strategy, horizon, 3)
    assert (found.width, found.per_user) == (rule.width, 3 * rule.width)
    if horizon != "tail":
        assert found.history == 3 * sum(rule.strategy.rows_at(t) for t in range(horizon))
    if strategy == "sqrt":
        assert found.constants == rule.strategy.query_matrix(horizon).size


def test_the_rule_of_a_sqrt_query_above_the_bound_is_refused_before_it_is_built():
    with pytest.raises(ValueError, match=r"horizon must be in \[1, 1024\] for strategy 'sqrt'"):
        running_rule("sqrt", 1025)


@pytest.mark.parametrize("strategy", RUNNING_STRATEGIES)
def test_within_the_bounds_a_query_releases_at_most_2_to_the_22_numbers_over_its_horizon(strategy):
    horizon = MAX_RUNNING_HORIZON[strategy]
    widest = MAX_USER_STATE // running_footprint(strategy, horizon, 1).width
    assert running_footprint(strategy, horizon, widest).history <= 1 << 22


def test_the_bounds_are_the_documented_numbers():
    assert dict(MAX_RUNNING_HORIZON) == {"blt": 16384, "sqrt": 1024, "tree": 16384}
    assert MAX_USER_STATE == 1024
