"""The HTTP side: the routes, the bearer token, and requests turned into responses or event streams.

    GET  /v1/models             the one model served
    GET  /v1/models/{id}
    POST /v1/chat/completions   messages -> chat template -> generation
    POST /v1/completions        a text prompt -> generation
    GET  /healthz               200 while the endpoint serves (no token asked)

A request is checked (app/api/request_body.py) and made ready (its prompt tokenized) before
anything is sent back, so every refusal is a 4xx in OpenAI's error shape; then it runs on
a thread of its own (app/api/reply_run.py). A client that disconnects stops its generation:
a stream's sender is cancelled by Starlette, a whole response's wait by a watcher of the
connection.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.api.engine import ApiEngine
from app.api.events import Delta, Failed, Finished
from app.api.errors import ApiError, bad_request, model_not_found
from app.api.reply_run import ReplyRun
from app.api.request_body import IGNORED, CompletionRequest, parse_request
from app.api.responses import DONE, ResponseShape, sse
from app.api.settings import ApiSettings

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024  # far above any prompt that fits a context
OPEN_PATHS = {"/healthz"}  # answered without the token


def error_response(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class Routes:
    def __init__(self, engine: ApiEngine, settings: ApiSettings):
        self.engine = engine
        self.settings = settings
        self.started = int(time.time())

    # ---- models ---------------------------------------------------------------------

    def _model(self) -> dict:
        engine = self.engine
        where = None if engine.url is None else ("embedded" if self.settings.models.embedded else engine.url)
        return {"id": self.settings.model_name, "object": "model", "created": self.started, "owned_by": "specwire",
                "specwire": {"draft": engine.draft_name, "target": engine.target_name or None, "service": where,
                             "context": engine.context_limit, "drafters": engine.pool.size}}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        asked = request.path_params["model"]
        if asked != self.settings.model_name:
            raise model_not_found(asked, self.settings.model_name)
        return JSONResponse(self._model())

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    # ---- completions ----------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, "chat")

    async def text(self, request: Request) -> Response:
        return await self._complete(request, "text")

    async def _complete(self, request: Request, kind: str) -> Response:
        parsed = parse_request(kind, await _read_json(request))
        if parsed.model != self.settings.model_name:
            raise model_not_found(parsed.model, self.settings.model_name)
        unknown = [name for name in parsed.ignored if name not in IGNORED]
        if unknown:
            log.info("ignoring fields this endpoint does not know: %s", ", ".join(unknown))
        run = ReplyRun(self.engine, parsed).start()
        refused = await run.accepted()
        if refused is not None:  # the prompt does not fit: said with its status, before any stream begins
            return error_response(refused.error)
        shape = ResponseShape(kind, parsed.model)
        if parsed.stream:
            return StreamingResponse(self._stream(run, shape, parsed), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._whole(request, run, shape)

    async def _stream(self, run: ReplyRun, shape: ResponseShape, parsed: CompletionRequest):
        usage = parsed.include_usage
        try:
            if shape.kind == "chat":
                yield sse(shape.chunk(first=True, include_usage=usage))
            async for event in run.events():
                if isinstance(event, Delta):
                    yield sse(shape.chunk(event.text, include_usage=usage, logprobs=event.logprobs))
                elif isinstance(event, Finished):
                    if event.tool_calls:
                        yield sse(shape.tool_calls_chunk(event, usage))
                    yield sse(shape.last_chunk(event, usage))
                    if usage:
                        yield sse(shape.usage_chunk(event))
                else:  # an error after the response began: OpenAI's clients raise it from the stream
                    yield sse(event.error.body())
            yield DONE
        finally:  # also when the client went away and Starlette cancelled this stream
            run.stop()

    async def _whole(self, request: Request, run: ReplyRun, shape: ResponseShape) -> Response:
        watcher = asyncio.create_task(_stop_on_disconnect(request, run))
        try:
            async for event in run.events():
                if isinstance(event, Finished):
                    return JSONResponse(shape.complete(event))
                if isinstance(event, Failed):
                    return error_response(event.error)
            raise AssertionError("a generation ended without its last event")
        finally:
            watcher.cancel()
            run.stop()


async def _read_json(request: Request):
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", code="too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None


async def _stop_on_disconnect(request: Request, run: ReplyRun) -> None:
    """Wait for the client to hang up (its body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    run.stop()


async def _api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    what = {404: f"there is no {request.url.path} here: the endpoint serves /v1/models, /v1/chat/completions "
                 "and /v1/completions",
            405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return error_response(ApiError(exc.status_code, what, code="not_found" if exc.status_code == 404 else None))


class BearerToken:
    """ASGI middleware: every request but /healthz must carry `Authorization: Bearer <token>`."""

    def __init__(self, app, token: str):
        self.app = app
        self._token = token.encode("utf-8")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not self._allowed(scope):
            error = ApiError(401, "this endpoint needs its token: send `Authorization: Bearer <token>` (the "
                                  "openai package: api_key=<token>)", code="invalid_api_key")
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._token)


def create_app(engine: ApiEngine, settings: ApiSettings):
    routes = Routes(engine, settings)
    app = Starlette(routes=[
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/v1/models/{model:path}", routes.model, methods=["GET"]),
        Route("/v1/chat/completions", routes.chat, methods=["POST"]),
        Route("/v1/completions", routes.text, methods=["POST"]),
        Route("/healthz", routes.healthz, methods=["GET"]),
    ], exception_handlers={ApiError: _api_error, HTTPException: _http_error})
    return BearerToken(app, settings.api_token) if settings.api_token else app
