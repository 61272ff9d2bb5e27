"""What adaptive k learned, kept between runs: one small JSON file in the cache, keyed by service and pair.

A short reply pays for the controller's first rounds, spent finding acceptance and costs
that the last run against the same service with the same pair already knew. So `generate`
and the chat start from the state saved last time, and save theirs after each reply. The
file is `$XDG_CACHE_HOME/specwire/adaptive-k.json` (default `~/.cache/specwire`), or the
one `SPECWIRE_ADAPTIVE_STATE` names; a
damaged or foreign entry is ignored (the controller starts from its priors), never an error.
The target's name comes from the service (its Welcome, up to a frame's size): the key holds a
hash of it, never the name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from local_draft.adaptive_k import AdaptiveK
from local_draft.stream_controller import StreamController
from local_draft.verify_client import LOOPBACK

log = logging.getLogger(__name__)

MAX_ENTRIES = 64  # services x pairs; the oldest are dropped beyond it
MAX_FILE_BYTES = 1024 * 1024  # 64 entries are a few KB: a larger file is damaged, and ignored


def memory_path() -> Path:
    if os.environ.get("SPECWIRE_ADAPTIVE_STATE"):
        return Path(os.environ["SPECWIRE_ADAPTIVE_STATE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specwire" / "adaptive-k.json"


def service_key(url: str) -> str:
    """The service's address; a local service is one whatever its port (the chat's picks a new one each run)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}" if host in LOOPBACK else f"{parts.scheme}://{parts.netloc}{parts.path}"


class ControllerMemory:
    """Load and save one controller's state under (service, draft model, target model)."""

    def __init__(self, url: str, draft_name: str, target_name: str, path: Path | None = None, mode: str = "rounds"):
        target = hashlib.sha256(target_name.encode("utf-8", "replace")).hexdigest()[:16]
        # the round-based loop's key has no mode; the stream's controller keeps an entry of its own
        self.key = f"{service_key(url)} | {draft_name} | target {target}" + ("" if mode == "rounds" else f" | {mode}")
        self.path = path or memory_path()

    def load_into(self, controller: AdaptiveK | StreamController) -> bool:
        """Start `controller` from the saved state; False when there is none usable."""
        state = self._read().get(self.key)
        if state is None:
            return False
        try:
            controller.restore(state)
        except ValueError as exc:
            log.info("ignoring the saved adaptive-k state for %s: %s", self.key, exc)
            return False
        log.info("adaptive k starts from the state saved for %s", self.key)
        return True

    def save(self, controller: AdaptiveK | StreamController) -> None:
        entries = self._read()
        entries.pop(self.key, None)
        entries[self.key] = controller.state()  # last: the most recently used
        entries = dict(list(entries.items())[-MAX_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # written whole, then renamed: a reader never sees half a file
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as file:
                json.dump(entries, file)
            os.replace(file.name, self.path)
        except OSError as exc:
            log.warning("cannot save the adaptive-k state to %s: %s", self.path, exc)

    def _read(self) -> dict:
        try:
            with open(self.path, "rb") as file:
                data = file.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"{self.path} is larger than an adaptive-k state file")
            entries = json.loads(data)
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested brackets
            if not isinstance(exc, FileNotFoundError):
                log.info("ignoring the adaptive-k state file %s: %s", self.path, str(exc)[:200])
            return {}
        return entries if isinstance(entries, dict) else {}
