"""The curator side: the DuckDB curator store (ledger, outbox, row balance), the privacy report,
the features stage and the training stage. Everything here may hold per-user data or exact counts;
nothing here is imported by the analysts' side (:mod:`queries`)."""
