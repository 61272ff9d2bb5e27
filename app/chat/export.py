"""A saved chat as a Markdown document (`/save`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from app.chat.conversation import Conversation
from wire.visible_text import visible

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")  # a CommonMark code fence's opening or closing line


def close_open_fence(text: str) -> str:
    """`text` with a closing line for a code block left open (a reply stopped inside one), so that
    what follows it in the document is not swallowed into the code."""
    open_fence = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match is None:
            continue
        fence = match.group(1)
        if open_fence is None:
            open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not line.strip()[len(fence):]:
            open_fence = None  # a closing fence: the same character, at least as long, nothing after
    return text if open_fence is None else text.rstrip("\n") + "\n" + open_fence


def to_markdown(conversation: Conversation, models: str) -> str:
    """The chat as a Markdown document; control characters of the text are shown as symbols (a file
    read with `cat` must not act on the terminal)."""
    return visible(_document(conversation, models))


def _document(conversation: Conversation, models: str) -> str:
    lines = [f"# specwire chat {conversation.chat_id or ''}".rstrip(), ""]
    if conversation.created:
        lines += [f"Started {conversation.created} · {models}", ""]
    if conversation.system:
        lines += ["**System**", "", conversation.system, ""]
    for turn in conversation.turns:
        lines += ["## You", "", turn.user, "", "## Assistant", "", close_open_fence(turn.reply.text.rstrip()) or "*(no reply)*", ""]
        counts = turn.reply.counts()
        if turn.reply.provenance:
            verified = counts["draft"] + counts["target"]
            lines += [f"*{len(turn.reply.provenance)} tokens, {verified} verified by the target"
                      + (f", {counts['offline']} unverified (offline)" if counts["offline"] else "") + "*", ""]
    return "\n".join(lines)


def default_path(conversation: Conversation) -> Path:
    return Path.cwd() / f"specwire-chat-{conversation.chat_id or 'unsaved'}.md"


def save_markdown(conversation: Conversation, models: str, path: Path) -> Path:
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    # a conversation: readable by its owner only, as the saved chats are (a file that exists keeps its mode)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as file:
        file.write(to_markdown(conversation, models))
    return path.resolve()
