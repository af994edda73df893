"""The daily job (``renyi-stream run``): one run per day over a DuckDB curator store, and the demo."""
