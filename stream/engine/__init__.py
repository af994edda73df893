"""The Beam-free engine every job calls: a shard's ledger and its window charge
(:mod:`renyi_stream.stream.engine.shard_state`), user-to-shard assignment (:mod:`renyi_stream.stream.engine.sharding`), the
input readers (:mod:`renyi_stream.stream.engine.readers`), what a ledger keeps for life
(:mod:`renyi_stream.stream.engine.ledger_config`), the one publication rule (:mod:`renyi_stream.stream.engine.publication`)
and the one row balance (:mod:`renyi_stream.stream.engine.row_balance`). It imports the core (``stream``) and
nothing above it: no Beam, no DuckDB, no ``pipelines`` or ``queries``."""
