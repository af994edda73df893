"""The Beam-free engine every job calls: a shard's ledger and its window charge
(:mod:`stream.engine.shard_state`), user-to-shard assignment (:mod:`stream.engine.sharding`) and the
input readers (:mod:`stream.engine.readers`). It imports the core (``stream``) and nothing above it:
no Beam, no DuckDB, no ``pipelines`` or ``queries``."""
