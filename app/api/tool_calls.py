"""Function calling: a request's tools checked, put before the model, and its calls read back.

The tools reach the model through its own chat template (`tools`, and messages with
`tool_calls` and role `tool`, as Hugging Face templates take them). A template that takes no
tools (it never names them) gets them as a system message in the Hermes format that Qwen's
templates use, and the model calls as those templates ask:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

`tool_choice`:
- "none": no call is read back (the tools are still shown, as OpenAI does);
- "auto" (the default with tools): the reply is free text, read for calls in that format; a
  call the model starts (`<tool_call>`) is constrained by a grammar (wire/grammar.py's
  "tool_calls": the text around calls free, each call's JSON valid under the tools' schemas),
  so a call that is made always names a function and matches its parameters;
- "required" or a named function: the reply is constrained to one call, by a grammar (a JSON
  schema over the tools' names and their parameters, wire/grammar.py), so the arguments
  always match the function's schema: the reply is then the call's JSON alone.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from app.api.errors import bad_request
from wire.grammar import CALL_OPEN
from wire.protocol import Grammar

CHOICES = ("none", "auto", "required")
MAX_TOOLS = 128  # OpenAI's limit
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.S)
SYSTEM_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
SYSTEM_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call>")


@dataclass(frozen=True)
class Tools:
    """A request's functions (OpenAI's `tools` entries, checked) and its `tool_choice`."""

    functions: tuple[dict, ...]  # each {"type": "function", "function": {"name", "description"?, "parameters"?}}
    choice: str  # "none", "auto", "required", or "function:NAME", the function that must be called

    @property
    def names(self) -> list[str]:
        return [each["function"]["name"] for each in self.functions]

    @property
    def constrained(self) -> bool:
        """The reply is one call, by grammar."""
        return self.choice not in ("none", "auto")

    @property
    def reads_calls(self) -> bool:
        return self.choice != "none"

    def grammar(self) -> Grammar | None:
        """The grammar of the reply: under "required" or a named function, one call's JSON, {"name": one
        of the (chosen) functions, "arguments": its parameters}; under "auto", free text whose calls
        are such JSON; none under "none"."""
        if self.choice == "none":
            return None
        options = [{"type": "object",
                    "properties": {"name": {"const": f["function"]["name"]},
                                   "arguments": f["function"].get("parameters") or {"type": "object"}},
                    "required": ["name", "arguments"], "additionalProperties": False}
                   for f in self.functions
                   if self.choice in ("auto", "required") or self.choice == "function:" + f["function"]["name"]]
        schema = json.dumps(options[0] if len(options) == 1 else {"anyOf": options}, separators=(",", ":"))
        return Grammar("tool_calls" if self.choice == "auto" else "json_schema", schema)

    def system_text(self) -> str:
        """The tools as a system message, for a template that takes none."""
        return SYSTEM_HEADER + "\n".join(json.dumps(f, ensure_ascii=False) for f in self.functions) + SYSTEM_FOOTER

    def read(self, text: str) -> tuple[str | None, list[dict]]:
        """(the reply's content, its calls in OpenAI's shape) from the reply's text."""
        if not self.reads_calls:
            return text, []
        if self.constrained:
            call = _call(text.strip(), self.names)
            return (None, [call]) if call is not None else (text, [])
        calls = [call for found in _CALL.findall(text) if (call := _call(found, self.names)) is not None]
        if not calls and CALL_TAG not in text:
            # a reply that is one call and nothing else, bare or in a code fence, is a call too: the
            # default pair's coder drafter answers so under `auto` (```json {"name": ..., "arguments": ...} ```)
            bare = _call(_FENCE.sub(r"\1", text.strip()), self.names)
            return (None, [bare]) if bare is not None else (text, [])
        if not calls:
            return text, []
        content = text[: text.find(CALL_TAG)]  # as a stream sent it (app/api/generation.py, CallWatch)
        return content if content.strip() else None, calls


CALL_TAG = CALL_OPEN


class CallWatch:
    """In a stream under `tool_choice: auto`: the text that cannot be part of a call goes out as it
    comes; from a `<tool_call>` tag on (or what may be its start) it is held, to be read as calls
    at the reply's end, and so is a reply that opens as a bare call would (`{` or a code fence)."""

    def __init__(self):
        self.held = ""  # text not let through: a call, or what may begin one
        self.calling = False  # a tag came, or the reply opened as a call: everything from there on is held
        self._opened = False  # some of the reply went out (it did not open as a call)

    def feed(self, text: str) -> str:
        """The part of `text` (after what is held) that is safe to send now."""
        text = self.held + text
        if not self._opened and not self.calling:
            start = text.lstrip()
            if not start or "```".startswith(start[:3]) or start[0] == "{":
                self.calling = bool(start) and (start[0] == "{" or start.startswith("```"))
                self.held = text
                return ""
            self._opened = True
        if self.calling:
            self.held = text
            return ""
        at = text.find(CALL_TAG)
        if at >= 0:
            self.calling, self.held = True, text[at:]
            return text[:at]
        keep = next((n for n in range(min(len(CALL_TAG) - 1, len(text)), 0, -1)
                     if CALL_TAG.startswith(text[-n:])), 0)  # a tag's first characters, maybe
        self.held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]


def _call(text: str, names: list[str]) -> dict | None:
    """One call in OpenAI's shape, or None when `text` is not {"name": a known function, "arguments": {...}}."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models send the arguments already encoded
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


def parse_tools(body: dict) -> Tools | None:
    """The request's tools and tool_choice, checked (a 400 naming the field); None without tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("`tool_choice` needs `tools`: send the functions the model may call", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"`tools` must be a list of at most {MAX_TOOLS} functions", "tools")
    names = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise bad_request(f"`{where}` must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", where)
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise bad_request(f"`{where}.function.name` must be 1 to 64 letters, digits, _ or -",
                              f"{where}.function.name")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad_request(f"`{where}.function.parameters` must be a JSON schema object",
                              f"{where}.function.parameters")
        names.append(name)
    if len(set(names)) != len(names):
        raise bad_request("`tools` names a function twice", "tools")
    return Tools(tuple(tools), _choice(choice, names))


def _choice(choice: Any, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if choice in CHOICES:
        return choice
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "function" and named in names:
        return "function:" + named
    raise bad_request("`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                      f"\"function\": {{\"name\": one of {names}}}}}", "tool_choice")
