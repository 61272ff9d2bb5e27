"""Slash commands: parsing, their arguments, and errors that say what to type."""

from __future__ import annotations

import pytest

from app.chat.slash_commands import COMMANDS, help_text, is_command, parse, parse_temperature
from app.generation_flags import parse_k


def test_commands_parse_with_their_arguments():
    """`/k 8` -> k and "8"; names are case-insensitive; `//x` is a message, not a command."""
    command, argument = parse("/k 8")
    assert command.name == "k" and argument == "8"
    assert parse("/SYSTEM  be brief ")[1] == "be brief"
    assert is_command("/help") and not is_command("//help") and not is_command("hello /help")


def test_unknown_commands_and_bad_arguments_say_what_to_do():
    """Every mistake is a ValueError whose message points at the fix."""
    with pytest.raises(ValueError, match="/help lists them"):
        parse("/frobnicate")
    with pytest.raises(ValueError, match="number of draft tokens or auto"):
        parse_k("many")
    with pytest.raises(ValueError, match="0 or more"):
        parse_k("-1")
    with pytest.raises(ValueError, match="0 is greedy"):
        parse_temperature("warm")
    assert parse_k("AUTO") is None and parse_k("0") == 0 and parse_temperature("0.7") == 0.7


def test_help_lists_every_command_and_the_keys():
    """/help names each command and the keys for sending, new lines, stopping and the marks."""
    text = help_text()
    for command in COMMANDS:
        assert command.usage in text
    for key in ("enter", "ctrl+j", "esc", "ctrl+t", "ctrl+p"):
        assert key in text
