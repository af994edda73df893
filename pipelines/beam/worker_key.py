"""Bring the curator's noise key to a distributed worker, as a private local file.

The release step (:class:`renyi_stream.pipelines.beam.transforms.ReleaseWindow`) loads the noise key from a local
path in ``setup`` (:meth:`renyi_stream.stream.noise.NoiseKey.load`: mode 0600, 32 bytes). On a cluster that
file must come from a secret store, never from the container image or the job graph:

* **mounted file** (Flink on Kubernetes, any runner whose workers can mount a secret): mount
  the key at the same path on every worker (mode 0400 or 0600) and pass that path as
  ``--noise-key``; nothing here is involved.
* **Google Secret Manager** (Dataflow, or any worker with Google credentials): the launcher
  passes ``--renyi_noise_key_secret=projects/P/secrets/S/versions/V`` and
  ``--renyi_noise_key_path=/tmp/...`` as pipeline options and ``--beam_plugins=
  renyi_stream.pipelines.beam.worker_key``. Beam imports every plugin when an SDK harness starts, after it has
  read the pipeline options and before it runs any bundle; importing this module then fetches
  the secret (the worker's service account needs ``roles/secretmanager.secretAccessor``) and
  writes it to the path with mode 0600 (write to a private temporary file, then rename, so
  several harness processes on one VM never see half a key).

The key's fingerprint travels in the job graph (public); the key itself does not, and it is
never logged. A fetched key whose fingerprint differs from the graph's fails ``setup`` loudly.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from apache_beam.options.pipeline_options import PipelineOptions

from renyi_stream.stream.noise import write_durably

SECRET_OPTION = "renyi_noise_key_secret"
PATH_OPTION = "renyi_noise_key_path"
PLUGIN = "renyi_stream.pipelines.beam.worker_key"
_PORTABLE_KEY = re.compile(r"^beam:option:(?P<key>.*):v1$")


class NoiseKeyOptions(PipelineOptions):
    """The two options the worker start-up reads (set by :mod:`renyi_stream.pipelines.distributed.job`)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(f"--{SECRET_OPTION}", default=None,
                            help="Secret Manager version name of the curator's noise key "
                                 "(projects/P/secrets/S/versions/V); workers fetch it at start")
        parser.add_argument(f"--{PATH_OPTION}", default=None,
                            help="where workers write the fetched key (mode 0600)")


def fetch_secret(version_name: str) -> bytes:
    """The payload of a Secret Manager secret version (needs google-cloud-secret-manager,
    part of ``apache-beam[gcp]`` and of the Beam SDK container)."""
    from apache_beam.utils.secret import GcpSecret

    return GcpSecret(version_name).get_secret_bytes()


def materialise(secret: str, path: str | os.PathLike, fetch: Callable[[str], bytes] = fetch_secret) -> Path:
    """Write the secret's bytes to ``path`` (mode 0600, parent 0700) unless a file is there."""
    target = Path(path)
    if target.is_file():
        return target
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = fetch(secret)
    fd, scratch = tempfile.mkstemp(dir=target.parent, prefix=".noise-", suffix=".tmp")  # mode 0600
    try:
        write_durably(fd, data)
    except BaseException:
        os.close(fd)
        os.unlink(scratch)
        raise
    os.close(fd)
    os.replace(scratch, target)  # atomic: a concurrent harness sees no file or the whole key
    return target


def options_from_environment(environ: Mapping[str, str]) -> dict:
    """The pipeline options an SDK harness was started with (``PIPELINE_OPTIONS`` JSON, or the
    file ``PIPELINE_OPTIONS_FILE``), as Beam's ``sdk_worker_main`` reads them."""
    raw = environ.get("PIPELINE_OPTIONS")
    if "PIPELINE_OPTIONS_FILE" in environ:
        with open(environ["PIPELINE_OPTIONS_FILE"]) as handle:
            raw = handle.read()
    if not raw:
        return {}
    options = json.loads(raw)
    if "options" in options:
        return dict(options["options"])
    return {(m.group("key") if (m := _PORTABLE_KEY.match(k)) else k): v for k, v in options.items()}


def install_from_environment(environ: Mapping[str, str] = os.environ,
                             fetch: Callable[[str], bytes] = fetch_secret) -> Path | None:
    """Fetch the key named in the harness's options, if any; None when no secret is named."""
    options = options_from_environment(environ)
    secret, path = options.get(SECRET_OPTION), options.get(PATH_OPTION)
    if not secret:
        return None
    if not path:
        raise RuntimeError(f"--{SECRET_OPTION} is set but --{PATH_OPTION} is not: nowhere to put the key")
    return materialise(secret, path, fetch)


if "PIPELINE_OPTIONS" in os.environ or "PIPELINE_OPTIONS_FILE" in os.environ:  # an SDK harness starting
    install_from_environment()
