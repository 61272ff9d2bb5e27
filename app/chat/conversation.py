"""A conversation in memory: turns rebuilt from saved events, and the messages a model sees.

The saved file is the truth; this is its replay. The chat applies every event it writes
here too, so what is on screen, what is on disk and what the model is shown agree.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from app.chat.store import (
    ChatStarted, Committed, Event, Note, ReplyEnded, SystemPrompt, UserMessage, Withdrawn, read_events,
)
from local_draft.chat_template import Message

log = logging.getLogger(__name__)

LETTER = {"draft": "d", "target": "t", "offline": "o"}  # provenance as saved, one letter a token
PROVENANCE = {letter: name for name, letter in LETTER.items()}


@dataclass
class Reply:
    token_ids: list[int] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)  # "draft", "target" or "offline", one per token
    pieces: list[str] = field(default_factory=list)  # each token's text (a split character lands on the next)
    notes: list[str] = field(default_factory=list)
    stop_reason: str | None = None  # None: streaming now, or cut off by a crash of the app
    stats: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def counts(self) -> Counter:
        return Counter(self.provenance)


@dataclass
class Turn:
    number: int
    user: str
    at: str
    reply: Reply = field(default_factory=Reply)


@dataclass
class Conversation:
    chat_id: str | None = None  # None until the first message is saved
    created: str = ""
    system: str = ""
    turns: list[Turn] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Conversation:
        conversation = cls(chat_id=path.stem)
        for event in read_events(path):
            conversation.apply(event)
        return conversation

    def apply(self, event: Event) -> None:
        if isinstance(event, ChatStarted):
            self.chat_id, self.created = event.id, event.created
        elif isinstance(event, SystemPrompt):
            self.system = event.text
        elif isinstance(event, UserMessage):
            self.turns.append(Turn(event.turn, event.text, event.at))
        elif isinstance(event, Withdrawn):
            self.turns = [turn for turn in self.turns if turn.number < event.turn]
        elif isinstance(event, (Committed, Note, ReplyEnded)):
            reply = self.reply_of(event.turn)
            if reply is None:
                log.warning("chat %s: an event for turn %d, which has no message: skipped", self.chat_id, event.turn)
            elif isinstance(event, Committed):
                reply.token_ids += event.ids
                reply.provenance += [PROVENANCE.get(letter, "offline") for letter in event.provenance]
                reply.pieces += event.pieces
            elif isinstance(event, Note):
                reply.notes.append(event.text)
            else:
                reply.stop_reason, reply.stats = event.stop_reason, dict(event.stats)

    @property
    def next_turn(self) -> int:
        return self.turns[-1].number + 1 if self.turns else 1

    def messages(self, new_user: str | None = None, skip: int = 0) -> list[Message]:
        """System prompt, turns from the `skip`-th on, then `new_user`: what the template renders."""
        messages = [Message("system", self.system)] if self.system else []
        for turn in self.turns[skip:]:
            messages.append(Message("user", turn.user))
            if turn.reply.text:
                messages.append(Message("assistant", turn.reply.text))
        if new_user is not None:
            messages.append(Message("user", new_user))
        return messages

    def fit(self, new_user: str, count_tokens: Callable[[list[Message]], int],
            budget: int) -> tuple[list[Message], int]:
        """The messages to send within `budget` tokens, and how many oldest turns were left out.

        Oldest turns go first; the system prompt and the new message always stay. Raises
        ValueError when even those do not fit.
        """
        for skip in range(len(self.turns) + 1):
            messages = self.messages(new_user, skip)
            used = count_tokens(messages)
            if used <= budget:
                return messages, skip
        raise ValueError(f"the message takes {used:,} tokens with the system prompt, and the model's context "
                         f"leaves {budget:,} for them: shorten it")

    def reply_of(self, turn: int) -> Reply | None:
        for each in reversed(self.turns):
            if each.number == turn:
                return each.reply
        return None
