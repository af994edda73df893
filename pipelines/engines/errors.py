"""The one error of the local engines (:mod:`.local_cluster`, :mod:`.worker_env`)."""


class ClusterError(RuntimeError):
    """The cluster could not be fetched, started or stopped; the message says what and where."""
