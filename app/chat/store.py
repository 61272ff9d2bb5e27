"""Saved chats: one append-only JSON Lines file of events per conversation.

    $XDG_DATA_HOME/specwire/chats/<id>.jsonl      (default ~/.local/share/specwire/chats)

A conversation is private: chat files are created 0600 and their folder 0700 (an older,
wider folder is narrowed when a chat is created in it).

Each event is one line, written when it happens: the user's message before its reply
starts, every round's committed tokens as they are committed, notes (the service lost,
old turns left out of the context), and the end of each reply with its statistics. A line
reaches the operating system at once, so a crash of the app loses nothing committed; it is
fsync'd when a turn starts and ends and at most once a second while a reply streams, so a
power cut loses at most that second. Reading back skips a torn last line.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterator, Union

import msgspec

log = logging.getLogger(__name__)

FSYNC_EVERY_S = 1.0  # while a reply streams: at most one fsync a second
PRIVATE_FILE = 0o600  # a chat is read by its owner only
PRIVATE_FOLDER = 0o700


class ChatStarted(msgspec.Struct, tag="chat", tag_field="type"):
    id: str
    created: str  # ISO 8601, local time with its offset
    draft: str  # the draft model's file name
    service: str = ""  # the target's name, the service's URL, or "offline"
    version: int = 1


class SystemPrompt(msgspec.Struct, tag="system", tag_field="type"):
    text: str  # empty: no system prompt of ours (the template's default applies)


class UserMessage(msgspec.Struct, tag="user", tag_field="type"):
    turn: int
    text: str
    at: str


class Committed(msgspec.Struct, tag="tokens", tag_field="type"):
    """One round's tokens: ids, provenance (one letter each: d, t or o) and text pieces."""

    turn: int
    ids: list[int]
    provenance: str
    pieces: list[str]


class Note(msgspec.Struct, tag="note", tag_field="type"):
    turn: int
    text: str


class ReplyEnded(msgspec.Struct, tag="end", tag_field="type"):
    turn: int
    stop_reason: str  # "eos", "max_tokens", "context", "stopped" or "error"
    stats: dict = {}


class Withdrawn(msgspec.Struct, tag="withdrawn", tag_field="type"):
    """Turns from `turn` on are taken back (/retry, /edit): the file keeps them, the conversation not."""

    turn: int


Event = Union[ChatStarted, SystemPrompt, UserMessage, Committed, Note, ReplyEnded, Withdrawn]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


class ChatNotFound(LookupError):
    """No saved chat matches the id given."""


class ChatInUse(RuntimeError):
    """The chat is open in another running `specwire chat`: two writers would interleave its events."""


def in_use(path: Path) -> bool:
    """Whether a running chat holds this chat's file (its lock goes when that process ends, however)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the probe's lock
    return False


def chats_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "specwire" / "chats"


def now_iso() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


class ChatLog:
    """One chat's file, open for appending. Safe to write from several threads."""

    def __init__(self, path: Path):
        self.path = path
        self.id = path.stem
        # os.open with a mode: created 0600 whatever the umask (open() would make it 0644)
        self._file = os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE), "ab")
        try:  # held while the file is open; the system drops it when the process ends, even by kill -9
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise ChatInUse(f"chat {self.id} is open in another `specwire chat`") from None
        self._lock = threading.Lock()
        self._last_sync = time.monotonic()

    def write(self, event: Event, durable: bool = False) -> None:
        """Append one event; `durable` fsyncs now, otherwise at most once a second."""
        line = _encoder.encode(event) + b"\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            now = time.monotonic()
            if durable or now - self._last_sync >= FSYNC_EVERY_S:
                os.fsync(self._file.fileno())
                self._last_sync = now

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


@dataclass(frozen=True)
class ChatSummary:
    id: str
    created: str
    turns: int
    title: str  # the first user message, first line
    modified: float
    path: Path


class ChatStore:
    """The folder of saved chats."""

    def __init__(self, root: Path | None = None):
        self.root = root or chats_dir()

    def create(self, draft: str, service: str) -> ChatLog:
        private_folder(self.root)
        chat_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        chat = ChatLog(self.root / f"{chat_id}.jsonl")
        chat.write(ChatStarted(id=chat_id, created=now_iso(), draft=draft, service=service), durable=True)
        return chat

    def reopen(self, chat_id: str) -> ChatLog:
        return ChatLog(self.path_of(chat_id))

    def path_of(self, chat_id: str | None) -> Path:
        """The file of a chat by id (or a unique start of one); None: the latest chat no running chat
        has open (another terminal's chat may be newer). ChatInUse for a chat open elsewhere."""
        if chat_id is None:
            summaries = self.list()
            if not summaries:
                raise ChatNotFound(f"there is no saved chat in {self.root} yet")
            closed = [s for s in summaries if not in_use(s.path)]
            if not closed:
                raise ChatInUse(f"every saved chat in {self.root} is open in another `specwire chat`")
            return closed[0].path
        path = self.path_of_any(chat_id)
        if in_use(path):
            raise ChatInUse(f"chat {path.stem} is open in another `specwire chat`: quit that one first")
        return path

    def path_of_any(self, chat_id: str) -> Path:
        """The file of a chat by id (or a unique start of one), whether or not a running chat holds it."""
        exact = self.root / f"{chat_id}.jsonl"
        if exact.is_file():
            return exact
        matches = sorted(self.root.glob(f"{chat_id}*.jsonl")) if self.root.is_dir() else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise ChatNotFound(f"no saved chat {chat_id!r}: `specwire chat --list` shows them")
        raise ChatNotFound(f"{chat_id!r} matches {len(matches)} chats ({', '.join(m.stem for m in matches[:4])}"
                           f"{' ...' if len(matches) > 4 else ''}): give more of the id")

    def delete(self, chat_id: str) -> Path:
        """Remove a saved chat; ChatInUse if a running chat holds it."""
        path = self.path_of(chat_id)
        path.unlink()
        return path

    def list(self) -> list[ChatSummary]:
        """Every saved chat, the most recently changed first."""
        if not self.root.is_dir():
            return []
        summaries = []
        for path in self.root.glob("*.jsonl"):
            created, turns, title = "", set(), ""
            for event in read_events(path):
                if isinstance(event, ChatStarted):
                    created = event.created
                elif isinstance(event, UserMessage):
                    turns.add(event.turn)
                    if not title and event.text.strip():
                        title = event.text.strip().splitlines()[0]
                elif isinstance(event, Withdrawn):
                    turns = {turn for turn in turns if turn < event.turn}
            summaries.append(ChatSummary(path.stem, created, len(turns), title, path.stat().st_mtime, path))
        return sorted(summaries, key=lambda s: s.modified, reverse=True)


def private_folder(folder: Path) -> Path:
    """`folder`, made if missing, readable by its owner only (0700; one made before this rule is narrowed)."""
    folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
    if folder.stat().st_mode & 0o077:
        try:
            folder.chmod(PRIVATE_FOLDER)
        except OSError as exc:  # not ours: say so, and go on (the files in it are 0600 still)
            log.warning("cannot make %s private (chmod 700): %s", folder, exc.strerror)
    return folder


def read_events(path: Path) -> Iterator[Event]:
    """The events of a chat file in order; a line that does not decode is skipped (logged)."""
    with open(path, "rb") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                yield _decoder.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                # a torn last line after a crash, or an event from a newer version
                log.warning("%s line %d skipped: %s", path, number, exc)
