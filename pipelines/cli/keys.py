"""``renyi-stream key create PATH``: the curator's noise key, made once, before the first run.

The daily job creates its key beside its ledger on its first run; the Beam jobs (``renyi-stream
stream``, ``renyi-stream distributed``) read a key they are given (``--noise-key``), since their
workers must all load the same one. This command makes that key as the daily job makes its own
(:meth:`renyi_stream.stream.noise.NoiseKey.load_or_create`: 32 bytes of ``secrets.token_bytes``,
the file created ``O_CREAT | O_EXCL`` with mode ``0600`` and fsynced), with every missing folder
above it made ``0700`` (:func:`renyi_stream.stream.private_files.make_private_dirs`; a folder that
exists is left as it is), and prints the key's public fingerprint, which a launcher that cannot
read the key gives as ``--key-fingerprint``. It never overwrites, and never loads, what is
already at ``PATH``: a second key would make every later release's noise another key's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from renyi_stream.pipelines.cli.errors import PROG
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.private_files import make_private_dirs


class KeyExists(FileExistsError):
    """Something is already at the path a new key was asked for."""


def create_key(path: str | os.PathLike) -> NoiseKey:
    """Create a new noise key at ``path`` and return it: every missing folder above it ``0700``, the
    file ``0600`` from creation, 32 random bytes, fsynced (:meth:`NoiseKey.load_or_create`'s
    creation). :class:`KeyExists`, naming ``path``, when anything is there (a file, a folder, a
    link, even a dangling one): an existing key is never overwritten nor taken for a new one."""
    path = Path(path)
    if os.path.lexists(path):
        raise KeyExists(f"{path} already exists: a noise key is never overwritten (the releases made with it "
                        "could no longer be reproduced, and later ones would be noised with another key); give "
                        "a new path, or use the key that is there")
    make_private_dirs(path.parent)
    key = NoiseKey.load_or_create(path)  # O_CREAT | O_EXCL: a key a concurrent creator made is loaded, not replaced
    return key


def _create_command(args: argparse.Namespace) -> int:
    try:
        key = create_key(args.path)
    except (KeyExists, OSError) as exc:
        print(f"{PROG} key create: error: argument PATH: {exc}", file=sys.stderr)
        return 1
    print(f"created the noise key {args.path} (mode 0600); fingerprint {key.fingerprint}")
    print("keep it private and back it up with the curator's files: whoever reads it can take the noise off every "
          "release, and without it no release can be reproduced")
    return 0


def add_key_subcommand(sub: argparse._SubParsersAction) -> None:
    """Register ``key create PATH`` on the ``renyi-stream`` subcommands ``sub``."""
    key = sub.add_parser("key", help="the curator's noise key: create one for the Beam jobs (renyi-stream key create "
                         "PATH)", description="The noise key every release's noise is derived from (curator only).")
    actions = key.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", help="create a new noise key file (0600, missing folders 0700) and print its fingerprint",
        description="Create a new noise key at PATH: 32 random bytes, mode 0600, every missing folder above it "
                    "0700; print its fingerprint (for --key-fingerprint). Refused when anything is at PATH: a key is "
                    "never overwritten.")
    create.add_argument("path", metavar="PATH", help="where to create the key, e.g. stream.noise.key")
    create.set_defaults(handler=_create_command)


__all__ = ["KeyExists", "add_key_subcommand", "create_key"]
