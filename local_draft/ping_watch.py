"""Finding out a stalled link: a ping a second, and a pong missing past a bound cuts the socket.

A link that stalls moves no byte and closes nothing, so a client waiting for the next frame
would wait out its whole reply timeout. The watch pings the service every `interval_s`; a pong
that has not come back within `timeout_s` shuts the socket down, which ends every wait on the
connection at once (a lost connection, handled as any other: resume or go offline). websockets'
own keepalive would first wait out a close handshake that a stalled link cannot carry, and log
that wait as an error.
"""

from __future__ import annotations

import logging
import socket
import threading

from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.sync.connection import Connection

log = logging.getLogger(__name__)


class PingWatch:
    def __init__(self, ws: Connection, interval_s: float, timeout_s: float, name: str = "specwire-ping"):
        self.ws = ws
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.stalled = False  # set once a pong did not come back in time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.ws.state is not State.OPEN:
                return
            try:
                pong = self.ws.ping()
            except (ConnectionClosed, OSError, RuntimeError):
                return
            # wait in short steps: a stop (the client closing) ends the watch without a verdict
            waited = 0.0
            while not pong.wait(min(0.25, self.timeout_s - waited)):
                waited += 0.25
                if self._stop.is_set() or self.ws.state is not State.OPEN:
                    return
                if waited >= self.timeout_s:
                    self._cut()
                    return

    def _cut(self) -> None:
        self.stalled = True
        log.warning("the link stalled: no answer to a ping for %.0f s; closing the connection", self.timeout_s)
        try:
            self.ws.socket.shutdown(socket.SHUT_RDWR)
        except OSError:  # already gone
            pass
