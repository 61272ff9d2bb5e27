"""Structured service logs: every line about a session carries its id.

`session_log(logger, session_id)` gives an adapter that puts the id both in the message
(readable as text) and on the record as `session` (a field of its own in JSON lines).
`use_json_logs()` switches the process's handlers to one JSON object per line, for log
collectors (`specwire serve --log-format json`).
"""

from __future__ import annotations

import json
import logging
import time


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
