"""The endpoint's settings: one frozen object, made from the command line by `command`."""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.settings import ChatSettings

DEFAULT_PORT = 8766  # next to the service's 8765; clear of the ports other local runners take
DEFAULT_MODEL_NAME = "specwire"


@dataclass(frozen=True)
class ApiSettings:
    models: ChatSettings  # the models and the service, as `specwire chat` takes them (the connection reads it)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_token: str | None = None  # the bearer token clients must send; None: none asked
    model_name: str = DEFAULT_MODEL_NAME  # the one model GET /v1/models lists
    drafters: int = 1  # draft models loaded; a request holds one for its whole generation
