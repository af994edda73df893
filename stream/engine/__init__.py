"""The Beam-free engine every job calls: a shard's ledger and its window charge
(:mod:`stream.engine.shard_state`), user-to-shard assignment (:mod:`stream.engine.sharding`), the
input readers (:mod:`stream.engine.readers`), what a ledger keeps for life
(:mod:`stream.engine.ledger_config`), the one publication rule (:mod:`stream.engine.publication`)
and the one row balance (:mod:`stream.engine.row_balance`). It imports the core (``stream``) and
nothing above it: no Beam, no DuckDB, no ``pipelines`` or ``queries``."""
