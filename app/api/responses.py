"""The JSON a client gets back, in OpenAI's shapes: a whole response, or the chunks of a stream.

Chat: `chat.completion` / `chat.completion.chunk` with `message` / `delta`; text:
`text_completion` with `text`, streamed in chunks of the same object. A stream opens with
the assistant's role (chat), sends text as it is made, then a chunk with `finish_reason`
and the `specwire` provenance object, then (with `stream_options.include_usage`) a chunk
with no choices and the usage, then `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid

from app.api.events import Finished
from app.api.logprobs import choice_logprobs


def usage(finished: Finished) -> dict:
    return {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


def sse(payload: dict | str) -> str:
    """One server-sent event."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


DONE = sse("[DONE]")


class ResponseShape:
    """The envelope of one response: its id, creation time and model, for a chat or a text completion."""

    def __init__(self, kind: str, model: str):
        self.kind = kind
        self.model = model
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._offset = 0  # a text completion's text_offset at the next streamed token

    def _envelope(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    # ---- whole responses ------------------------------------------------------------

    def complete(self, finished: Finished) -> dict:
        if self.kind == "chat":
            message = {"role": "assistant", "content": finished.text}
            if finished.tool_calls:
                message = {"role": "assistant", "content": finished.content, "tool_calls": finished.tool_calls}
            choice = {"index": 0, "message": message, "logprobs": self._logprobs(finished.logprobs, whole=True),
                      "finish_reason": finished.finish_reason}
            body = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": finished.text, "logprobs": self._logprobs(finished.logprobs, whole=True),
                      "finish_reason": finished.finish_reason}
            body = self._envelope("text_completion")
        return {**body, "choices": [choice], "usage": usage(finished), "specwire": finished.provenance}

    # ---- streams --------------------------------------------------------------------

    def _logprobs(self, entries: list[dict] | None, whole: bool = False) -> dict | None:
        if entries is None:
            return None
        field, self._offset = choice_logprobs(self.kind, entries, 0 if whole else self._offset)
        return field

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False,
              include_usage: bool = False, logprobs: list[dict] | None = None) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(logprobs), "finish_reason": finish_reason}
            body = self._envelope("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": self._logprobs(logprobs),
                      "finish_reason": finish_reason}
            body = self._envelope("text_completion")
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None  # as OpenAI: null on every chunk but the last
        return body

    def tool_calls_chunk(self, finished: Finished, include_usage: bool) -> dict:
        """The reply's calls, whole, in one delta (they are read from the whole reply)."""
        body = self.chunk(include_usage=include_usage)
        calls = [{"index": i, **call} for i, call in enumerate(finished.tool_calls)]
        body["choices"][0]["delta"] = {"tool_calls": calls}
        return body

    def last_chunk(self, finished: Finished, include_usage: bool) -> dict:
        body = self.chunk(finish_reason=finished.finish_reason, include_usage=include_usage)
        body["specwire"] = finished.provenance
        return body

    def usage_chunk(self, finished: Finished) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._envelope(obj), "choices": [], "usage": usage(finished)}
