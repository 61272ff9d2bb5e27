"""A saved chat as a Markdown document (`/save`)."""

from __future__ import annotations

from pathlib import Path

from app.chat.conversation import Conversation


def to_markdown(conversation: Conversation, models: str) -> str:
    lines = [f"# specwire chat {conversation.chat_id or ''}".rstrip(), ""]
    if conversation.created:
        lines += [f"Started {conversation.created} · {models}", ""]
    if conversation.system:
        lines += ["**System**", "", conversation.system, ""]
    for turn in conversation.turns:
        lines += ["## You", "", turn.user, "", "## Assistant", "", turn.reply.text.rstrip() or "*(no reply)*", ""]
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
    path.write_text(to_markdown(conversation, models), encoding="utf-8")
    return path.resolve()
