"""Chat messages to prompt text, with the chat template a GGUF file carries.

GGUF files store their chat template as Jinja source (`tokenizer.chat_template`), the same
one Hugging Face tokenizers use. It is rendered in a sandbox, with the variables and
helpers such templates expect. A model without a template, or with one that fails to
render, gets ChatML, the format of the Qwen family and of the tiny test models.

A template is data from a file, which may come from a service (`--draft ngram` fetches its
vocabulary): the sandbox keeps it from Python's internals, and rendering is bounded too, so
that `'x' * 10**12`, a string doubled in a loop or nested loops of 100,000 end in a
ChatTemplateError, never a hang, a MemoryError or the OOM killer:
- a product or format that would make a string or list longer than MAX_RENDER_CHARS, and a
  filter or method given a width or count beyond it, is refused before it runs;
- the render's own lines are traced (sys.settrace, this thread only): past RENDER_SECONDS, or
  once the process's peak memory has grown MAX_RENDER_GROWTH_BYTES during it, the next line
  stops it;
- the text is made in pieces (`generate`) and stops at MAX_RENDER_CHARS.
"""

from __future__ import annotations

import json
import logging
import re
import resource
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from functools import wraps

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger(__name__)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


MAX_RENDER_CHARS = 4 * 1024 * 1024  # a prompt, or any string or list made on the way (a 128k context is ~0.5M chars)
RENDER_SECONDS = 2.0  # the longest render: a 100-message conversation takes milliseconds
MAX_RENDER_GROWTH_BYTES = 256 * 1024 * 1024  # of the process's peak memory during one render
# the widths and precisions of printf-style ("%10.3f") and str.format ("{:>10}") specs
_SPECS = (re.compile(r"%[-+ #0]*(\d*)(?:\.(\d+))?"), re.compile(r"\{[^{}]*:[^{}\d]*(\d*)(?:\.(\d+))?"))


class ChatTemplateError(ValueError):
    """A template that cannot be compiled or rendered."""


def _too_big(count) -> bool:
    return isinstance(count, int) and not isinstance(count, bool) and abs(count) > MAX_RENDER_CHARS


def _format_too_big(text) -> bool:
    """Whether a format string asks for a field wider than a render may make."""
    return isinstance(text, str) and any(len(number) > 7 or int(number) > MAX_RENDER_CHARS
                                         for spec in _SPECS for match in spec.findall(text)
                                         for number in match if number)


def _refuse(what: str):
    raise ChatTemplateError(f"the chat template asked for {what}, beyond the {MAX_RENDER_CHARS:,} characters a "
                            "render may make")


def _bounded_filter(function):
    """A filter that refuses a width or count beyond MAX_RENDER_CHARS (center, indent, format, ...).
    The value filtered is not an argument of that kind: a large number may be shown."""
    skip = 2 if hasattr(function, "jinja_pass_arg") else 1  # the context (if passed), then the value

    @wraps(function)
    def bounded(*args, **kwargs):
        arguments = list(args[skip:]) + list(kwargs.values())
        if any(_too_big(value) for value in arguments):
            _refuse(f"the filter {function.__name__.removeprefix('do_')} with a width or count that large")
        if function.__name__ == "do_format" and _format_too_big(args[skip - 1] if len(args) >= skip else None):
            _refuse("a format that wide")
        return function(*args, **kwargs)
    return bounded


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with products, powers, formats and calls that cannot make huge objects."""

    intercepted_binops = frozenset(["*", "**", "%"])

    def call_binop(self, context, operator_name, left, right):
        if operator_name == "*":
            sizes = [len(side) for side in (left, right) if isinstance(side, (str, bytes, list, tuple))]
            counts = [side for side in (left, right) if isinstance(side, int) and not isinstance(side, bool)]
            if sizes and counts and sizes[0] * max(counts[0], 0) > MAX_RENDER_CHARS:
                _refuse(f"a sequence of {sizes[0]} times {counts[0]}")
        elif operator_name == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 \
                    and abs(left) > 1 and right * abs(left).bit_length() > 8 * MAX_RENDER_CHARS:
                _refuse(f"{left} ** {right}")
        elif operator_name == "%" and isinstance(left, str) and _format_too_big(left):
            _refuse("a % format that wide")
        return super().call_binop(context, operator_name, left, right)

    def wrap_str_format(self, value):
        # str.format is reached through attribute access here (jinja 3.1.3+), not through call()
        if getattr(value, "__name__", "") in ("format", "format_map") and _format_too_big(getattr(value, "__self__", None)):
            return lambda *args, **kwargs: _refuse("a format that wide")
        return super().wrap_str_format(value)

    def call(self, __context, __obj, *args, **kwargs):
        if any(_too_big(value) for value in (*args, *kwargs.values())):
            _refuse(f"{getattr(__obj, '__name__', 'a call')} with a count that large")
        if getattr(__obj, "__name__", "") in ("format", "format_map") and isinstance(getattr(__obj, "__self__", None), str) \
                and _format_too_big(__obj.__self__):
            _refuse("a format that wide")
        return super().call(__context, __obj, *args, **kwargs)


class _RenderGuard:
    """Stops a render past its time or memory budget, at the next line of the template's own code."""

    def __init__(self):
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.peak = _peak_bytes() + MAX_RENDER_GROWTH_BYTES

    def __enter__(self):
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc_info):
        sys.settrace(self._previous)

    def _on_call(self, frame, event, arg):
        # only the template's compiled code is traced line by line: its loops are where a render spins
        return self._on_line if frame.f_code.co_filename == "<template>" else None

    def _on_line(self, frame, event, arg):
        if event == "line":
            if time.monotonic() > self.deadline:
                raise ChatTemplateError(f"the chat template took more than {RENDER_SECONDS:g} s to render: "
                                        "it loops too long")
            if _peak_bytes() > self.peak:
                raise ChatTemplateError(f"the chat template took more than {MAX_RENDER_GROWTH_BYTES >> 20} MiB "
                                        "of memory to render")
        return self._on_line


def _peak_bytes() -> int:
    """The process's peak resident memory (Linux reports kilobytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user", "assistant" or "tool"
    content: str
    tool_calls: tuple = ()  # an assistant's calls: ({"id", "type": "function", "function": {"name", "arguments"}}, ...)
    tool_call_id: str = ""  # a tool message: the call it answers

    def for_template(self) -> dict:
        """The message as Hugging Face templates take it (a call's arguments as an object, not its JSON text)."""
        message = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [_call_for_template(call) for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        return message


def _call_for_template(call: dict) -> dict:
    function = dict(call.get("function", {}))
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass  # left as the client sent it
    return {**call, "function": function}


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Hugging Face renders tojson without escaping non-ASCII: templates expect that
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template: `render(messages)` gives the prompt text."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.is_fallback = not source
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        environment = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.filters = {name: _bounded_filter(f) for name, f in environment.filters.items()}
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = environment.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc

    @property
    def takes_tools(self) -> bool:
        """Whether the template shows the model a `tools` list (Qwen's and Llama 3's do; ChatML does not)."""
        return "tools" in self.source

    def render(self, messages: list[Message], add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> str:
        """The prompt text; ChatTemplateError if the template fails, or runs past a bound (see above).
        `tools`: the functions the model may call (OpenAI's `tools` entries), for templates that take them."""
        extra = {"tools": tools} if tools else {}
        pieces, size = [], 0
        try:
            with _RenderGuard():
                for piece in self._template.generate(
                        messages=[m.for_template() for m in messages],
                        add_generation_prompt=add_generation_prompt,
                        bos_token=self.bos_token, eos_token=self.eos_token, **extra):
                    size += len(piece)
                    if size > MAX_RENDER_CHARS:
                        _refuse("a prompt that long")
                    pieces.append(piece)
        except ChatTemplateError:
            raise
        except Exception as exc:  # a template is data: whatever it raises (MemoryError, RecursionError) is its error
            raise ChatTemplateError(f"the chat template failed to render: {type(exc).__name__}: {exc}") from exc
        return "".join(pieces)


def template_for(source: str | None, bos_token: str, eos_token: str) -> ChatTemplate:
    """The model's own template, or ChatML when it has none or it is broken (logged)."""
    if source:
        try:
            template = ChatTemplate(source, bos_token, eos_token)
            template.render([Message("user", "hello")])  # fail now, not on the first prompt
            return template
        except ChatTemplateError as exc:
            log.warning("%s; using ChatML instead", exc)
    return ChatTemplate(None, bos_token, eos_token)
