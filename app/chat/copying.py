"""What `/copy` takes from a reply: the whole text, or its code blocks without their fences."""

from __future__ import annotations

import re

from app.chat.export import FENCE


def code_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks in `text`, in order; one left open (a stopped reply) counts."""
    blocks: list[str] = []
    fence, lines = None, []
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None:
            if match is not None:
                fence, lines = match.group(1), []
        elif match is not None and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                and not line.strip()[len(match.group(1)):]:
            blocks.append("\n".join(lines))
            fence = None
        else:
            lines.append(line)
    if fence is not None:
        blocks.append("\n".join(lines))
    return blocks


def parse_copy_argument(argument: str) -> int | None:
    """`/copy` -> None (the whole reply); `/copy code` -> -1 (the last block); `/copy code N` -> N - 1."""
    words = argument.split()
    if not words:
        return None
    if words[0] != "code" or len(words) > 2 or (len(words) == 2 and not re.fullmatch(r"[1-9]\d*", words[1])):
        raise ValueError(f"/copy takes nothing, `code` or `code N`, got {argument!r}")
    return int(words[1]) - 1 if len(words) == 2 else -1
