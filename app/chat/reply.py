"""One reply's tokens: the prompt made from the conversation, and the rounds committed after it.

The tokens of the previous turns are kept as they were generated, and only the text the
chat template adds after them is tokenized, so the drafter's and the service's caches stay
valid from one turn to the next. A reply ends at the first end-of-generation token; what
each round commits is decoded into text pieces for the screen and the saved chat.
"""

from __future__ import annotations

import codecs
from typing import Callable

from local_draft.chat_template import ChatTemplate, Message
from local_draft.draft_model import DraftModel

OnRound = Callable[[list[int], list[str], list[str]], None]  # tokens, provenance, text pieces


class PromptTokens:
    """Tokens of rendered prompts, reusing the last turn's tokens where its text is a prefix."""

    def __init__(self, draft: DraftModel, template: ChatTemplate):
        self.draft = draft
        self.template = template
        self._known_text = ""  # the text whose tokens are _known_tokens (the last prompt and its reply)
        self._known_tokens: list[int] = []

    def of(self, text: str) -> list[int]:
        if self._known_text and text.startswith(self._known_text):
            return self._known_tokens + self.draft.tokenize(text[len(self._known_text):], add_bos=False)
        bos_text = self.template.bos_token
        add_bos = self.draft.add_bos and not (bos_text and text.startswith(bos_text))
        return self.draft.tokenize(text, add_bos=add_bos)

    def unread(self, tokens: list[int]) -> int:
        """How many of a prompt's tokens the models have not read yet (their caches hold the rest)."""
        known = self._known_tokens
        return len(tokens) - len(known) if known and tokens[: len(known)] == known else len(tokens)

    def count(self, messages: list[Message]) -> int:
        return len(self.of(self.template.render(messages)))

    def remember(self, text: str, tokens: list[int]) -> None:
        """The last prompt and its reply, as text and as the tokens that were generated."""
        self._known_text, self._known_tokens = text, tokens

    def forget(self) -> None:
        self.remember("", [])


class ReplyRounds:
    """The committed rounds of one reply, cut at its first end token, as text pieces."""

    def __init__(self, draft: DraftModel, end_ids: frozenset[int], on_round: OnRound):
        self.draft = draft
        self.end_ids = end_ids
        self.on_round = on_round
        self.ended = False  # an end token came: the Speculator stops after this round
        self.kept: list[int] = []  # the reply's tokens up to and with its end token
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def commit(self, tokens: list[int], provenance: list[str]) -> None:
        if self.ended:
            return
        for i, token in enumerate(tokens):
            if token in self.end_ids:
                tokens, provenance, self.ended = tokens[: i + 1], provenance[: i + 1], True
                break
        pieces = [self._decoder.decode(self.draft.token_bytes(t)) for t in tokens]
        self.kept.extend(tokens)
        self.on_round(list(tokens), list(provenance), pieces)

    @property
    def body(self) -> list[int]:
        """The reply's tokens without its end token."""
        return [t for t in self.kept if t not in self.end_ids]
