"""Service sessions opened ahead: a request takes one that is ready instead of waiting for a handshake.

Each request has a session of its own (its sampling settings travel in the Hello, and it
is closed when the request ends), but opening one costs a TCP connection, the WebSocket
upgrade (and TLS) and the Hello/Welcome exchange: a few round trips, which a request
would wait for before its first token; `specwire generate` and the chat open theirs
before they time anything. So one spare session is kept open for the sampling settings
of the latest request (editors send the same ones every time); a request with those
settings and no seed takes it, and a new spare is opened in the background. A seeded
request opens its own (the seed keys the service's draws from its Hello on). A spare the
service closed meanwhile (idle, restarted) is reopened by its link when taken.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from local_draft.service_link import OnState, ServiceLink
from local_draft.verify_client import ServiceUnreachable, VerifyError
from wire.protocol import SamplingParams

log = logging.getLogger(__name__)

OpenLink = Callable[[SamplingParams, "int | None", "OnState | None"], ServiceLink]


class WarmSessions:
    def __init__(self, open_link: OpenLink):
        self._open = open_link  # (params, seed, on_state) -> a new connected link; raises when it cannot
        self._lock = threading.Lock()
        self._spare: tuple[SamplingParams, ServiceLink] | None = None
        self._opening: SamplingParams | None = None  # a spare being opened for these settings
        self._closed = False

    def take(self, params: SamplingParams, seed: int | None, on_state: OnState) -> tuple[ServiceLink, str]:
        """A session for one request, and how it was had: the spare if it fits ("session opened ahead"),
        else one opened now ("session opened for the request"); raises as ServiceLink does."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare[0] == params and seed is None:
            link = spare[1]
            connections = link.connections
            if link.current() is not None:  # a spare the service closed meanwhile is reopened here
                link.on_state = on_state  # what happens to it from now on is this request's to tell
                self.prepare_for(params)
                if link.connections > connections:
                    return link, "session opened ahead, found closed and opened again"
                return link, "session opened ahead"
        if spare is not None:
            spare[1].close()
        self.prepare_for(params)
        return self._open(params, seed, on_state), "session opened for the request"

    def prepare_for(self, params: SamplingParams) -> None:
        """Open the next spare for `params` in the background (one at a time)."""
        with self._lock:
            if self._closed or self._opening is not None:
                return
            self._opening = params
        threading.Thread(target=self._open_spare, args=(params,), name="specwire-api-spare", daemon=True).start()

    def _open_spare(self, params: SamplingParams) -> None:
        link = None
        try:
            link = self._open(params, None, None)
        except (ServiceUnreachable, VerifyError) as exc:
            log.info("no spare session: %s", exc)  # the next request opens its own, and says why if it fails
        with self._lock:
            self._opening = None
            if link is not None and self._spare is None and not self._closed:
                self._spare, link = (params, link), None
        if link is not None:
            link.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare[1].close()
