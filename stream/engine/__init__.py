"""The Beam-free engine every job calls: a shard's ledger and its window charge
(:mod:`stream.engine.shard_state`), user-to-shard assignment (:mod:`stream.engine.sharding`), the
input readers (:mod:`stream.engine.readers`) and what a ledger keeps for life
(:mod:`stream.engine.ledger_config`). It imports the core (``stream``) and nothing above it:
no Beam, no DuckDB, no ``pipelines`` or ``queries``."""
