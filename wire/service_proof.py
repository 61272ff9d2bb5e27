"""The service proves it holds the bearer token, before the client says a word of the conversation.

A bearer token proves the client to the service, not the other way round. The chat's embedded
service listens on a loopback port and is restarted on the same port after a crash: in that
gap another local user can take the port, and without a proof the chat would connect to it
and send the whole conversation in its Sync. So a client that asks sends a random challenge
in the upgrade request (`X-Specwire-Challenge`), and the service answers it in the upgrade
response (`X-Specwire-Proof`: HMAC-SHA256 of the challenge, keyed by the token). The client
checks the proof before its Hello. Plain HTTP headers: no protocol message changes, and a
client that does not ask is served as before.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

CHALLENGE_HEADER = "X-Specwire-Challenge"
PROOF_HEADER = "X-Specwire-Proof"
MAX_CHALLENGE_CHARS = 128


def new_challenge() -> str:
    return secrets.token_hex(16)


def proof(token: str, challenge: str) -> str:
    """What a service holding `token` answers to `challenge`."""
    return hmac.new(token.encode(), challenge.encode(), hashlib.sha256).hexdigest()


def proves(token: str, challenge: str, answer: str | None) -> bool:
    """Whether `answer` is the proof of `token` for `challenge` (compared in constant time)."""
    return answer is not None and hmac.compare_digest(answer.encode(), proof(token, challenge).encode())
