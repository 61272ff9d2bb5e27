"""Slash commands: what exists, how each is written, and parsing their arguments.

What each does is in app/chat/slash_handlers.py; the command palette lists the same set.
Parsing errors are ValueErrors whose message tells the user what to type instead; `/k`
reads its argument like the --k flag (app/generation_flags.parse_k).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str  # how it is written, for /help
    help: str
    argument: bool = False  # the palette puts "/name " in the prompt box for the user to finish


COMMANDS = [
    SlashCommand("help", "/help", "the commands and keys"),
    SlashCommand("offline", "/offline", "the draft model alone: no service, tokens unverified"),
    SlashCommand("online", "/online", "verify again (starts the embedded service if it stopped)"),
    SlashCommand("k", "/k N|auto", "draft tokens per round; 0: the service writes every token (remote)", True),
    SlashCommand("temperature", "/temperature T", "sampling temperature; 0 is greedy", True),
    SlashCommand("system", "/system [TEXT|-]", "show the system prompt, set it, or remove it (-)", True),
    SlashCommand("retry", "/retry", "take the last reply back and generate it again"),
    SlashCommand("edit", "/edit", "take the last message and its reply back, into the box to change"),
    SlashCommand("copy", "/copy [code [N]]", "the last reply, or its last (N-th) code block, to the clipboard", True),
    SlashCommand("marks", "/marks", "provenance on raw text, or rendered Markdown (ctrl+t)"),
    SlashCommand("stats", "/stats", "statistics of every turn and of the whole chat"),
    SlashCommand("save", "/save [FILE]", "write the chat as Markdown (default: ./specwire-chat-ID.md)", True),
    SlashCommand("chats", "/chats [open|delete N|ID]", "the saved chats (ctrl+o); open or delete one", True),
    SlashCommand("clear", "/clear", "start a new chat (this one stays saved)"),
    SlashCommand("quit", "/quit", "leave (ctrl+q); the chat is saved as it goes"),
]
BY_NAME = {command.name: command for command in COMMANDS}


def is_command(text: str) -> bool:
    """A prompt that starts with one slash is a command ("//" sends a literal slash)."""
    return text.startswith("/") and not text.startswith("//")


def parse(text: str) -> tuple[SlashCommand, str]:
    """`/name argument` -> the command and its argument (stripped)."""
    name, _, argument = text.strip()[1:].partition(" ")
    command = BY_NAME.get(name.lower())
    if command is None:
        raise ValueError(f"unknown command /{name}: /help lists them")
    return command, argument.strip()


def parse_temperature(argument: str) -> float:
    try:
        return float(argument)
    except ValueError:
        raise ValueError(f"/temperature takes a number (0 is greedy), got {argument!r}") from None


def help_text() -> str:
    width = max(len(command.usage) for command in COMMANDS)
    lines = [f"{command.usage:{width}}  {command.help}" for command in COMMANDS]
    lines += ["",
              "enter sends · ctrl+j or alt+enter: a new line · up/down: earlier prompts · //x sends /x",
              "esc stops a reply (keeping what came) · pgup/pgdn scroll · ctrl+t raw/Markdown · ctrl+o chats · ctrl+p commands",
              "ctrl+q quits"]
    return "\n".join(lines)
