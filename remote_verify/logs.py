"""Structured service logs: every line about a session carries its id.

`session_log(logger, session_id)` gives an adapter that puts the id both in the message
(readable as text) and on the record as `session` (a field of its own in JSON lines).
`use_json_logs()` switches the process's handlers to one JSON object per line, for log
collectors (`specwire serve --log-format json`).

Clients choose some of the text that is logged (their name, their vocabulary fingerprint,
the values in a frame refused). A newline in it would start a line of the client's making
in the service's log: `printable()` escapes such text where it is logged, and
`escape_log_messages()` escapes every message of the process's handlers again, in text or
JSON, so that one record is one line whatever reaches it.
"""

from __future__ import annotations

import json
import logging
import time

from wire.visible_text import escaped


def printable(text: str, limit: int | None = None) -> str:
    """`text` (its first `limit` characters) with every character that is not printable
    (newlines, terminal escape sequences, line separators) written as its escape: `\\n`, `\\x1b`."""
    return escaped(text, limit)


class EscapeControlCharacters(logging.Filter):
    """Rewrites a record whose message holds a character that is not printable, escaped.

    A traceback (exc_info) is formatted apart from the message and keeps its lines.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = printable(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True


def escape_log_messages() -> None:
    """Give every handler of the root logger the escaping filter (`specwire serve` does, in any format)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig()
    for handler in root.handlers:
        if not any(isinstance(each, EscapeControlCharacters) for each in handler.filters):
            handler.addFilter(EscapeControlCharacters())


class SessionLog(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        session = self.extra["session"]
        kwargs["extra"] = {**kwargs.get("extra", {}), "session": session}
        return f"session {session}: {msg}", kwargs


def session_log(logger: logging.Logger, session_id: str) -> SessionLog:
    return SessionLog(logger, {"session": session_id})


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and session when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        session = getattr(record, "session", None)
        if session is not None:
            entry["session"] = session
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def use_json_logs() -> None:
    """Format every handler of the root logger as JSON lines."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig()
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
