"""The dialog for a service the chat cannot use: what went wrong, and what can be done now.

Answers (the screen's result): "offline" (go on with the draft model alone), "retry",
or "quit". Only the answers that make sense for the problem are offered.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from app.chat.state import StartupProblem

TITLES = {
    "missing_model": "A model is missing",
    "service_failed": "The verification service did not start",
    "unreachable": "The verification service cannot be reached",
    "refused": "The verification service refused this chat",
}


class ProblemScreen(ModalScreen[str]):
    BINDINGS = [Binding("escape", "dismiss('quit')", "Quit"), Binding("o", "answer('offline')", "Offline"),
                Binding("r", "answer('retry')", "Retry")]

    def __init__(self, problem: StartupProblem):
        super().__init__()
        self.problem = problem

    def compose(self) -> ComposeResult:
        with Vertical(id="problem"):
            yield Label(TITLES.get(self.problem.kind, "The chat cannot start"), classes="role")
            yield Static(str(self.problem), markup=False, id="problem-message")
            if self.problem.offline_possible:
                yield Static("You can chat with the draft model alone: its replies are not verified by "
                             "the target, and are marked so. /online tries the service again later.",
                             markup=False, id="problem-offer")
            with Horizontal(id="problem-buttons"):
                if self.problem.offline_possible:
                    yield Button("Chat offline (o)", id="offline", variant="primary")
                if self.problem.retry_possible:
                    yield Button("Retry (r)", id="retry")
                yield Button("Quit (esc)", id="quit", variant="error")

    def on_mount(self) -> None:
        self.query_one(Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)

    def action_answer(self, answer: str) -> None:
        if self.query(f"#{answer}"):
            self.dismiss(answer)
