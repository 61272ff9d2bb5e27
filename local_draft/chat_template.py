"""Chat messages to prompt text, with the chat template a GGUF file carries.

GGUF files store their chat template as Jinja source (`tokenizer.chat_template`), the same
one Hugging Face tokenizers use. It is rendered in a sandbox, with the variables and
helpers such templates expect. A model without a template, or with one that fails to
render, gets ChatML, the format of the Qwen family and of the tiny test models.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

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


class ChatTemplateError(ValueError):
    """A template that cannot be compiled or rendered."""


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


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
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = environment.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"the chat template failed to render: {exc}") from exc


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
