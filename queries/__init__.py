"""Analyst-facing queries and the release store (lands with the queries issue)."""
