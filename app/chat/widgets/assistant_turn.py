"""One reply in the transcript: streamed as it is committed, with its notes and figures.

Two views, switched with ctrl+t. The raw view shows the reply's text with every token
coloured by provenance. The Markdown view renders it (`marked_markdown.py`): code blocks keep
a colour per token, prose shows its provenance as a gutter, since rendering moves its words.
Both follow the stream; the hidden view is brought up to date when it is shown, so streaming
pays for one view only.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Static

from app.chat.conversation import Reply
from app.chat.widgets.marked_markdown import MarkedMarkdown
from app.chat.widgets.marked_text import MarkedText
from app.chat.widgets.waiting_line import WaitingLine

STOP_REASONS = {
    "eos": "",
    "max_tokens": "stopped at the reply length limit (--max-tokens)",
    "context": "stopped: the context is full",
    "stopped": "stopped by you",
    "error": "stopped by an error",
    None: "interrupted (the app stopped during this reply)",
}


SOURCE_NAMES = {"ngram": "n-gram", "model": "model"}


def reply_summary(reply: Reply, stats: dict | None, steady: bool) -> str:
    """One line under a reply: its tokens by provenance, acceptance, tokens per round, speed."""
    counts = reply.counts()
    parts = [f"{len(reply.provenance)} tokens: {counts['draft']} draft, {counts['target']} target"
             + (f", {counts['offline']} unverified" if counts["offline"] else "")]
    stats = stats or {}
    if stats.get("rounds"):
        if stats.get("drafted"):
            parts.append(f"acceptance {stats['acceptance_rate']:.0%}")
        sources = stats.get("by_source") or {}
        if "ngram" in sources:  # n-gram drafting was on: each drafter's accepted/drafted tokens
            parts.append(", ".join(f"{SOURCE_NAMES.get(name, name)} {c['accepted']}/{c['drafted']}"
                                   for name, c in sorted(sources.items())))
        parts.append(f"{stats['tokens_per_round']:.2f} tokens/round")
        if not steady and stats.get("tokens_per_s"):
            parts.append(f"{stats['tokens_per_s']:.1f} tokens/s")
    if not steady and stats.get("first_token_s") is not None:
        parts.append(f"first token {stats['first_token_s']:.1f} s")
    return " · ".join(parts)


class AssistantTurn(Vertical):
    def __init__(self, turn: int, marks: bool, steady: bool = False, reply: Reply | None = None, **kwargs):
        super().__init__(**kwargs)
        self.turn = turn
        self.marks = marks
        self.steady = steady
        self.reply = reply or Reply()  # what has been shown so far (a finished turn's saved reply)
        self.finished = reply is not None  # a saved reply is over, even one a crash interrupted
        self._markdown_pieces = 0  # pieces of the reply the Markdown view holds
        self._markdown_finished = False

    def compose(self) -> ComposeResult:
        yield Label("Assistant", classes="role")
        waiting = WaitingLine(self.steady, classes="waiting")
        waiting.display = not self.finished and not self.reply.pieces
        yield waiting
        marked = MarkedText(classes="body")
        marked.add(self.reply.pieces, self.reply.provenance)
        marked.display = self.marks
        yield marked
        markdown = MarkedMarkdown(classes="rendered")
        markdown.display = not self.marks
        yield markdown
        yield Static("", markup=False, classes="notes")
        yield Static("", markup=False, classes="summary")

    async def on_mount(self) -> None:
        self._show_notes()
        if self.finished:
            self._show_summary(self.reply.stats)
        if not self.marks:
            await self._catch_up_markdown()

    def reading(self, prompt_tokens: int, unread_tokens: int) -> None:
        self.query_one(WaitingLine).show_reading(prompt_tokens, unread_tokens)

    def wait_for(self, what: str) -> None:
        self.query_one(WaitingLine).wait_for(what)

    @property
    def waiting_for(self) -> str:
        return self.query_one(WaitingLine).waiting_for

    @property
    def waiting(self) -> bool:
        """No token yet, and the reply has not ended."""
        return not self.finished and not self.reply.pieces

    async def add(self, pieces: list[str], provenance: list[str]) -> None:
        if pieces:
            self.query_one(WaitingLine).display = False
        self.reply.pieces += pieces
        self.reply.provenance += provenance
        self.query_one("MarkedText.body", MarkedText).add(pieces, provenance)
        if not self.marks:
            await self._catch_up_markdown()

    def add_note(self, text: str) -> None:
        self.reply.notes.append(text)
        self._show_notes()

    async def finish(self, stop_reason: str, stats: dict) -> None:
        self.finished = True
        self.query_one(WaitingLine).display = False
        self.reply.stop_reason, self.reply.stats = stop_reason, stats
        if not self.marks:
            await self._catch_up_markdown()
        self._show_summary(stats)

    async def set_marks(self, marks: bool) -> None:
        self.marks = marks
        self.query_one("MarkedText.body", MarkedText).display = marks
        self.query_one(MarkedMarkdown).display = not marks
        if not marks:
            await self._catch_up_markdown()

    async def _catch_up_markdown(self) -> None:
        view = self.query_one(MarkedMarkdown)
        shown, self._markdown_pieces = self._markdown_pieces, len(self.reply.pieces)
        if shown < len(self.reply.pieces):
            await view.add(self.reply.pieces[shown:], self.reply.provenance[shown:])
        if self.finished and not self._markdown_finished:
            self._markdown_finished = True
            await view.finish()

    def _show_notes(self) -> None:
        notes = self.query_one(".notes", Static)
        notes.update("\n".join("› " + note for note in self.reply.notes))
        notes.display = bool(self.reply.notes)

    def _show_summary(self, stats: dict | None) -> None:
        reason = STOP_REASONS.get(self.reply.stop_reason, self.reply.stop_reason)
        line = reply_summary(self.reply, stats, self.steady)
        self.query_one(".summary", Static).update(line + (f" · {reason}" if reason else ""))
