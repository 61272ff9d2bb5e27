"""Starting a new conversation on a session without a Sync's round trip.

A Generate may say that the client's history shares only the first `keep` tokens of the
service's (wire/protocol.py `Generate.keep`): the service drops the rest and appends the
new tokens in the same frame. Before a service offered this, a new conversation on an open
session (another chat, an API request, a benchmark's next prompt) sent a Sync first and
waited a round trip for its answer, in every mode; now that Sync is left for the errors
that need it (a service that lost track of the session).
"""

from __future__ import annotations

from typing import Callable

from local_draft.verify_client import VerifyClient

CAPABILITY = "rewind"  # in Welcome.capabilities of a service that takes Generate.keep and Generate.seed


def can_rewind(client: VerifyClient) -> bool:
    """Whether the service on this connection takes a Generate that keeps part of its history."""
    return CAPABILITY in client.welcome.capabilities


def shared_prefix(service_history: list[int], history: list[int]) -> int:
    """How many leading tokens the service's copy and the client's history have in common."""
    limit = min(len(service_history), len(history))
    common = 0
    while common < limit and service_history[common] == history[common]:
        common += 1
    return common


def opening(client: VerifyClient, service_history: list[int], history: list[int], rebuild: bool,
            sync: Callable[[], None]) -> tuple[int, int]:
    """(committed_len, keep) for the Generate that starts a reply after `history`; `service_history`:
    what the service holds, as the client knows it. Where the service's copy differs (or `rebuild`:
    a new seed, a retry), the Generate keeps what both share, or, on a service that cannot, `sync`
    rebuilds the copy first (a round trip) and the Generate keeps it all (-1)."""
    known = len(service_history)
    if not rebuild and service_history == history[:known]:
        return known, -1
    if can_rewind(client):
        return known, shared_prefix(service_history, history)
    sync()
    return len(history), -1
