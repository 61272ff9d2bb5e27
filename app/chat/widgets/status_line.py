"""The status line: mode, connection, round trip, k, acceptance, tokens per round, tokens/s, context used."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from app.chat.state import Connection, LiveStats
from app.chat.widgets.foreground import foreground_style


CONTEXT_WARNING = 0.8  # of the context used: the meter turns to the warning colour


class StatusLine(Static):
    COMPONENT_CLASSES = {"status--mode", "status--up", "status--down", "status--label"}

    def __init__(self, steady: bool = False, **kwargs):
        super().__init__("", markup=False, **kwargs)
        self.steady = steady  # no timings: a screen that compares equal from run to run

    def show(self, stats: LiveStats, connection: Connection, busy_text: str = "",
             context: tuple[int, int] | None = None) -> None:
        """`context`: (tokens the conversation takes, the model's context), the meter; None hides it."""
        def style(name: str):
            return foreground_style(self, name)  # no background: the line's own shows
        parts: list[Text] = [Text(stats.mode, style("status--mode"))]
        if stats.mode == "offline":
            parts.append(Text("○ " + connection.detail if connection.detail == "starting" else
                              "○ not verified (/online)", style("status--down")))
        elif connection.connected:
            parts.append(Text("● " + connection.detail, style("status--up")))
        else:
            parts.append(Text("○ " + connection.detail, style("status--down")))
        if stats.mode != "offline" and not self.steady and stats.verified_rounds:
            parts.append(self._field("rtt", f"{stats.round_trip_s * 1000:.0f} ms"))
        k = "auto" if stats.k is None else str(stats.k)
        if stats.k is None and stats.last_k:
            k += f" ({stats.last_k})"
        parts.append(self._field("k", k))
        if stats.rounds:
            if stats.drafted:
                parts.append(self._field("accept", f"{stats.acceptance_rate:.0%}"))
            parts.append(self._field("tok/round", f"{stats.tokens_per_round:.2f}"))
            if not self.steady:
                parts.append(self._field("tok/s", f"{stats.tokens_per_s:.1f}"))
        if context is not None and context[0]:
            used, limit = context
            meter = self._field("ctx", f"{used:,}/{limit:,}")
            if used >= CONTEXT_WARNING * limit:  # the oldest turns are about to be left out
                meter.stylize(style("status--down"), len("ctx "))
            parts.append(meter)
        if busy_text:
            parts.append(Text(busy_text, style("status--label")))
        self.update(Text(" │ ").join(parts))

    def _field(self, label: str, value: str) -> Text:
        return Text.assemble((label + " ", foreground_style(self, "status--label")), value)
