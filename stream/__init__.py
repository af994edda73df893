"""renyi-stream privacy core: engine-free accounting, ledger, noise and schema (numpy, pyarrow)."""
