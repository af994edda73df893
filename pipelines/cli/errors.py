"""How the command line words an error: as argparse words its own, naming the option it is about.

Every subcommand's parser records its options (``option_names``: ``dest -> --option``) in the
namespace it parses, so the wording needs no parser of its own and no import of the commands.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

PROG = "renyi-stream"

# How messages from the library open, and the option they are about (when the command has it).
_MESSAGE_OPTIONS = (
    ("cannot open release store", "--store"), ("release store", "--store"),
    ("cannot open the ledger", "--ledger"), ("the ledger", "--ledger"),
    ("cannot open noise key file", "--noise-key"), ("noise key file", "--noise-key"),
    ("input file", "--input"), ("inputs", "--input"), ("features file", "--features"),
    ("n_shards", "--shards"), ("query_id", "--id"), ("effective_from", "--from"),
    ("the schedule", "--end"), ("unexpected pipeline runner", "--runner"), ("weight of", "--weighted"),
    ("the label window", "--label-start"),
)


def options_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``dest -> --option`` for the long options of one (sub)command's parser, each by its first
    long name (``--noise-key``, not its aliases ``--noise_key`` and ``--key``)."""
    return {a.dest: long[0] for a in parser._actions
            if (long := [s for s in a.option_strings if s.startswith("--")]) and a.dest != "help"}


def record_option_names(parser: argparse.ArgumentParser) -> None:
    """Give every leaf subcommand of ``parser`` the default ``option_names`` (its options), which
    :func:`name_the_option` reads from the parsed namespace."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        parser.set_defaults(option_names=options_of(parser))
    for action in subs:
        for child in action.choices.values():
            record_option_names(child)


def name_the_option(message: str, args: Any = None) -> str:
    """``message`` opened with ``argument --option:``, as argparse words its own errors, when it
    is about one of the parsed command's options (``epsilon must be > 0`` -> ``argument --epsilon:
    epsilon must be > 0``; a message opening with a path given to ``--store`` names ``--store``)."""
    if message.startswith(("argument ", "--")):
        return message
    options: dict[str, str] = getattr(args, "option_names", None) or {}
    for dest, option in options.items():
        value = getattr(args, dest, None)  # a file given to this option
        if isinstance(value, str) and ("/" in value or "." in value) and message.startswith(value):
            return f"argument {option}: {message}"
    lowered = message.lower()
    for phrase, option in _MESSAGE_OPTIONS:
        if lowered.startswith(phrase) and option in options.values():
            return f"argument {option}: {message}"
    word = re.match(r"[a-z_]+", message)
    if word and word.group(0) in options:
        return f"argument {options[word.group(0)]}: {message}"
    return message


def worded(message: str, args: Any, parser: argparse.ArgumentParser) -> str:
    """:func:`name_the_option` for a job with a parser of its own (the distributed and streaming
    jobs): ``message`` naming the option of ``parser`` it is about."""
    if getattr(args, "option_names", None) is None:
        args.option_names = options_of(parser)
    return name_the_option(message, args)
