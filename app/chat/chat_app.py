"""The chat application: it builds the engine, shows it on the chat screen, and adds the slash commands to the palette."""

from __future__ import annotations

from functools import partial
from typing import Iterable

from textual.app import App, SystemCommand
from textual.screen import Screen

from app.chat.chat_screen import ChatScreen
from app.chat.engine import ChatEngine
from app.chat.settings import ChatSettings
from app.chat.slash_commands import COMMANDS


class ChatApp(App):
    CSS_PATH = "chat.tcss"
    TITLE = "specwire chat"

    def __init__(self, settings: ChatSettings):
        super().__init__()
        self.settings = settings
        self.engine = ChatEngine(settings)
        self.chat_screen = ChatScreen(settings, self.engine)

    def on_mount(self) -> None:
        self.push_screen(self.chat_screen)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, ChatScreen):
            for command in COMMANDS:
                yield SystemCommand(command.usage, command.help, partial(screen.commands.from_palette, command))
