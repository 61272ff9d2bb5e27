"""The target's log probabilities in OpenAI's shapes: `logprobs.content` (chat), and the legacy
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset` lists (/v1/completions).

They come from the service with each committed token (wire/protocol.py `TokenLogprobs`): the
target's, never the drafter's, whether a guess or the target's own pick made the token. A token
made offline (no service) has no target log probability: its `logprob` is null and its
`top_logprobs` empty, never the drafter's figure in its place. End tokens are not listed: they
are no part of the text.
"""

from __future__ import annotations

from typing import Callable

from wire.protocol import TokenLogprobs


class LogprobEntries:
    """One reply's tokens with their log probabilities, as chat's `logprobs.content` entries."""

    def __init__(self, token_bytes: Callable[[int], bytes], end_ids: frozenset[int]):
        self._token_bytes = token_bytes
        self._end_ids = end_ids

    def _text(self, token: int) -> tuple[str, bytes]:
        data = self._token_bytes(token)
        return data.decode("utf-8", errors="replace"), data

    def of(self, tokens: list[int], logprobs: list[TokenLogprobs | None]) -> list[dict]:
        """The entries of these tokens (end tokens left out)."""
        out = []
        for token, given in zip(tokens, logprobs):
            if token in self._end_ids:
                continue
            text, data = self._text(token)
            entry = {"token": text, "logprob": None if given is None else given.logprob, "bytes": list(data),
                     "top_logprobs": []}
            if given is not None:
                for other, logprob in zip(given.top_ids, given.top_logprobs):
                    other_text, other_data = self._text(other)
                    entry["top_logprobs"].append({"token": other_text, "logprob": logprob, "bytes": list(other_data)})
            out.append(entry)
        return out


def choice_logprobs(kind: str, entries: list[dict], offset: int = 0) -> tuple[dict, int]:
    """A choice's `logprobs` object for a chat or a text completion, and the text offset after it
    (a text completion's `text_offset` counts characters from the reply's start)."""
    if kind == "chat":
        return {"content": entries, "refusal": None}, offset
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}, offset
