"""The features job (``renyi-stream features``): one training row per user from the daily indicator
files, as a Beam batch job on the daily job's read and validation."""
