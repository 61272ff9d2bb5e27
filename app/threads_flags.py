"""Thread-count flags: `serve --threads` / `--batch-threads` and the client commands'
`--draft-threads`, checked once; and the flags a command gives the service it starts beside
its drafter.

A count not given on the command line comes from the environment (`SPECWIRE_THREADS`,
`SPECWIRE_BATCH_THREADS`, `SPECWIRE_DRAFT_THREADS`), then from the config file's
`[threads]` table, then from the thread plan (wire/threads.py):

    [threads]
    draft = 1          # the drafter's llama.cpp threads (generate, chat, demo, bench)
    service = 2        # `specwire serve`'s llama.cpp threads for one-token steps, and for
                       # blocks too unless service_batch says otherwise
    service_batch = 2  # `specwire serve`'s threads for blocks (verification, prompts)

A service that chat, demo or bench start beside their drafter gets, for one-token steps,
the physical cores the drafter leaves, and for blocks every physical core.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path

from wire.threads import DRAFT_THREADS, shared_service_batch_threads, shared_service_threads, thread_count

# The flags' default: a string, so that argparse runs it through the flag's type at parse
# time, and only for the command being run (a broken config file does not stop `models list`).
NOT_GIVEN = "(environment, config file or thread plan)"
THREAD_SETTINGS = {"draft": "SPECWIRE_DRAFT_THREADS", "service": "SPECWIRE_THREADS",
                   "service_batch": "SPECWIRE_BATCH_THREADS"}


def threads_flag(text: str) -> int:
    """A thread count, for argparse: a whole number of at least 1, or argparse's error saying why not."""
    try:
        return thread_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configured_threads(setting: str, path: Path | None = None) -> int | None:
    """The `[threads]` count named `setting` ("draft", "service", "service_batch"): the environment's, else the
    config file's, else None (the plan decides). A wrong value names where it came from."""
    variable = THREAD_SETTINGS[setting]
    if (text := os.environ.get(variable)) is not None:
        try:
            return thread_count(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"${variable}: {exc}") from None
    from models.registry import config_path

    path = path or config_path()
    if not path.is_file():
        return None
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("threads", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read the config file {path}: {exc}") from None
    unknown = set(table) - set(THREAD_SETTINGS)
    if unknown:
        raise argparse.ArgumentTypeError(f"{path}: [threads] has no setting {', '.join(sorted(unknown))} "
                                         f"(there are {', '.join(THREAD_SETTINGS)})")
    if setting not in table:
        return None
    value = table[setting]
    if isinstance(value, bool) or not isinstance(value, int):
        raise argparse.ArgumentTypeError(f"{path}: [threads] {setting} must be a whole number, got {value!r}")
    try:
        return thread_count(str(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path}: [threads] {setting}: {exc}") from None


def _draft_threads_flag(text: str) -> int:
    if text == NOT_GIVEN:
        configured = configured_threads("draft")
        return DRAFT_THREADS if configured is None else configured
    return threads_flag(text)


def _service_threads_flag(text: str) -> int | None:
    if text == NOT_GIVEN:
        return configured_threads("service")  # None: the backend takes the physical cores
    return threads_flag(text)


def _service_batch_threads_flag(text: str) -> int | None:
    if text == NOT_GIVEN:
        return configured_threads("service_batch")  # None: as many as --threads
    return threads_flag(text)


def add_draft_threads_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--draft-threads (default: $SPECWIRE_DRAFT_THREADS, else [threads] draft, else 1)."""
    parser.add_argument("--draft-threads", type=_draft_threads_flag, default=NOT_GIVEN,
                        help=f"llama.cpp threads of the draft model (default: $SPECWIRE_DRAFT_THREADS, else "
                             f"the config file's [threads] draft, else {DRAFT_THREADS}: a small drafter gains "
                             "little from more, and a service on the same machine needs the rest)")


def add_service_threads_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """serve --threads (default: $SPECWIRE_THREADS, else [threads] service, else the physical cores)."""
    parser.add_argument("--threads", type=_service_threads_flag, default=NOT_GIVEN,
                        help="llama.cpp threads of the llamacpp backend (default: $SPECWIRE_THREADS, else the "
                             "config file's [threads] service, else the physical cores this process may use; "
                             "give fewer when a drafter shares the machine)")
    parser.add_argument("--batch-threads", type=_service_batch_threads_flag, default=NOT_GIVEN,
                        help="llama.cpp threads for blocks: a draft block's verification, a prompt (default: "
                             "$SPECWIRE_BATCH_THREADS, else the config file's [threads] service_batch, else as "
                             "many as --threads); a block is arithmetic that more cores speed up, a one-token "
                             "step is bound by memory bandwidth")


def colocated_serve_flags(draft_threads: int) -> list[str]:
    """`specwire serve` flags for a service started on the drafter's machine (chat, demo, bench):
    one-token steps on the physical cores the drafter leaves, blocks on every physical core
    (the rule and its measurements: wire/threads.py)."""
    return ["--threads", str(shared_service_threads(draft_threads)),
            "--batch-threads", str(shared_service_batch_threads())]
