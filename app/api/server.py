"""The endpoint on uvicorn: the ASGI app served on the socket `command` bound, until SIGINT or SIGTERM.

uvicorn stops taking connections on either signal, lets running responses finish for a few
seconds, then cancels them (which stops their generations), and re-raises the signal once
it returns: SIGTERM then raises SystemExit here, so the caller's cleanup (the embedded
service, the drafters) runs instead of the process dying on the spot.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys

import uvicorn

from app.api.engine import ApiEngine
from app.api.routes import create_app
from app.api.settings import ApiSettings

log = logging.getLogger(__name__)

GRACEFUL_S = 5  # how long running responses may finish after a signal


def _exit_quietly(signum, frame) -> None:
    raise SystemExit(0)


def serve(engine: ApiEngine, settings: ApiSettings, listener: socket.socket) -> None:
    listener.listen(128)
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(create_app(engine, settings), log_config=None, lifespan="off",
                            access_log=logging.getLogger().isEnabledFor(logging.INFO),
                            timeout_graceful_shutdown=GRACEFUL_S)
    server = uvicorn.Server(config)
    previous = signal.signal(signal.SIGTERM, _exit_quietly)
    try:
        print(f"listening on http://{shown}:{port}/v1", flush=True)
        print(f"[model: {settings.model_name}; draft {engine.draft_name}, "
              f"{'offline' if engine.url is None else 'verified by ' + engine.url}]", file=sys.stderr, flush=True)
        server.run(sockets=[listener])
    finally:
        signal.signal(signal.SIGTERM, previous)
