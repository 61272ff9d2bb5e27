"""Reading the bearer token a service requires from the file the user names."""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

from app.user_error import UserError

log = logging.getLogger(__name__)


def read_token_file(path: str | None) -> str | None:
    """The token in `path` (stripped), None without a path; UserError if it cannot be used."""
    if not path:
        return None
    file = Path(path)
    try:
        token = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"cannot read the token file {path}: {exc.strerror}") from exc
    if not token:
        raise UserError(f"the token file {path} is empty")
    if file.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s can be read by other users: chmod 600 %s", path, path)
    return token


MAX_TOKEN_LINE = 4096


def read_token_line() -> str:
    """The token on the first line of standard input (`serve --token-stdin`), read byte by byte so that
    nothing after it is taken from the pipe; UserError if there is none."""
    fd, line = sys.stdin.fileno(), b""
    while not line.endswith(b"\n") and len(line) < MAX_TOKEN_LINE:
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    token = line.decode("utf-8", "replace").strip()
    if not token:
        raise UserError("--token-stdin: standard input gave no token (write it as the first line)")
    return token
