"""ApiError: a request the endpoint refuses, in OpenAI's error shape.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "tools", "code": null}}

Clients (the `openai` package and everything built on it) read `message` and show it, so
it says what was wrong and what to do; `param` names the field.
"""

from __future__ import annotations


class ApiError(Exception):
    """A refusal with its HTTP status, OpenAI error type, the field at fault and a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind  # OpenAI's `type`

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


def model_not_found(asked: str, served: str) -> ApiError:
    return ApiError(404, f"The model `{asked}` does not exist here: this endpoint serves `{served}` "
                         "(GET /v1/models lists it).", "model", "model_not_found")


def service_error(message: str) -> ApiError:
    """The verification service refused or failed the request (not the client's fault)."""
    return ApiError(502, message, None, "service_error", kind="server_error")
