"""Thread-count flags: `serve --threads` and the client commands' `--draft-threads`, checked once.

The defaults and the rule behind them are in wire/threads.py.
"""

from __future__ import annotations

import argparse
import os

from wire.threads import DRAFT_THREADS, thread_count


def threads_flag(text: str) -> int:
    """A thread count, for argparse: a whole number of at least 1, or argparse's error saying why not."""
    try:
        return thread_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_draft_threads_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--draft-threads (default: $SPECWIRE_DRAFT_THREADS, else 1)."""
    parser.add_argument("--draft-threads", type=threads_flag,
                        default=os.environ.get("SPECWIRE_DRAFT_THREADS", str(DRAFT_THREADS)),
                        help="llama.cpp threads of the draft model (default: %(default)s; a small drafter "
                             "gains little from more, and a service on the same machine needs the rest)")
