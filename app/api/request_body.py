"""The body of a completion request, checked field by field: supported, refused, or ignored.

Every field a request may carry is in one of three tables, which docs/openai-api.md
mirrors:
- supported: read and applied (`messages`, `prompt`, `max_tokens`, `temperature`,
  `response_format`, `tools`, `logprobs`, ...);
- refused unless neutral: a field that would change the output in a way this endpoint
  cannot (`n` > 1, penalties, images, the legacy `functions`, ...) is a 400 naming it, so that
  no client gets text made as if it had been applied; sent with its neutral value
  (`n: 1`, `frequency_penalty: 0`, `logit_bias: {}`) it is accepted;
- ignored: bookkeeping that cannot change the output (`user`, `metadata`, `store`, ...).
A field in none of them is ignored too, and named in the response's `specwire.ignored`
and the log: not silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from app.api.errors import bad_request
from app.api.tool_calls import Tools, parse_tools
from local_draft.chat_template import Message
from wire.grammar import grammar_problems
from wire.limits import MAX_TOP_LOGPROBS
from wire.protocol import Grammar, SamplingParams
from wire.randomness import seed_problem

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: a request that sends none samples
MAX_OPENAI_TEMPERATURE = 2.0  # OpenAI's range is 0 to 2
MAX_STOPS = 64  # OpenAI takes 4; editors send more for code completion

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
          "logprobs"}
SUPPORTED = {"chat": COMMON | {"messages", "max_completion_tokens", "response_format", "tools", "tool_choice",
                               "top_logprobs"},
             "text": COMMON | {"prompt"}}
MAX_TEXT_LOGPROBS = 5  # /v1/completions' `logprobs` (OpenAI's legacy limit); chat's top_logprobs: MAX_TOP_LOGPROBS


def _absent_or(*neutral) -> Callable[[Any], bool]:
    return lambda value: value is None or any(value == each and type(value) is type(each) for each in neutral)


UNPENALIZED = "the output is the target's own distribution, unpenalized: leave it out or send "
NO_TOOLS = "the legacy functions API is not served: "
CONSTRAINED = "there is no constrained output here"
TRUNCATIONS = "top_p and top_k are the truncations offered"
TEXT_MODEL = "this endpoint serves a text model"
_COMMON_REFUSED = {
    "frequency_penalty": (_absent_or(0, 0.0), UNPENALIZED + "0"),
    "presence_penalty": (_absent_or(0, 0.0), UNPENALIZED + "0"),
    "logit_bias": (_absent_or({}), "the output is the target's own distribution: leave it out or send {}"),
    "best_of": (_absent_or(1), "one completion a request here: leave it out or send 1"),
    # extensions other servers take, each of which changes the output
    "min_p": (_absent_or(0, 0.0), TRUNCATIONS),
    "typical_p": (_absent_or(1, 1.0), TRUNCATIONS),
    "repetition_penalty": (_absent_or(1, 1.0), UNPENALIZED + "1"),
    "ignore_eos": (_absent_or(False), "a reply ends where the target ends it"),
    "min_tokens": (_absent_or(0), "a reply ends where the target ends it"),
    "stop_token_ids": (_absent_or([]), "use `stop` strings"),
    "grammar": (_absent_or(), CONSTRAINED),
    "guided_json": (_absent_or(), CONSTRAINED),
    "guided_regex": (_absent_or(), CONSTRAINED),
    "guided_choice": (_absent_or(), CONSTRAINED),
    "guided_grammar": (_absent_or(), CONSTRAINED),
    "mirostat": (_absent_or(0), TRUNCATIONS),
}
REFUSED = {
    "chat": {
        **_COMMON_REFUSED,
        "functions": (_absent_or([]), NO_TOOLS + "send `tools` instead"),
        "function_call": (_absent_or("none", "auto"), NO_TOOLS + "send `tool_choice` instead"),
        "audio": (_absent_or(), TEXT_MODEL),
        "modalities": (_absent_or(["text"]), TEXT_MODEL + ": leave it out or send [\"text\"]"),
        "prediction": (_absent_or(), "there are no predicted outputs here"),
        "web_search_options": (_absent_or(), "there is no web search here"),
        "reasoning_effort": (_absent_or(), "the target is not served as a reasoning model"),
    },
    "text": {
        **_COMMON_REFUSED,
        "echo": (_absent_or(False), "the response holds the completion alone: leave it out or send false"),
        "suffix": (_absent_or(""), "there is no insertion (fill in the middle) here"),
    },
}
# OpenAI's bookkeeping fields: documented as ignored (any other unknown field is ignored as well)
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "safety_identifier",
           "prompt_cache_key", "verbosity"}

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# others (`name`: chat templates have no place for it) are ignored
MESSAGE_FIELDS = {"role", "content", "tool_calls", "tool_call_id"}
MESSAGE_REFUSED = {
    "function_call": "assistant messages with function_call (the legacy functions API) are not supported: "
                     "send tool_calls",
    "audio": "audio is not supported: " + TEXT_MODEL,
}


@dataclass(frozen=True)
class CompletionRequest:
    """What a request asks for, checked: a chat (messages) or a text prompt, and how to generate."""

    kind: str  # "chat" (/v1/chat/completions) or "text" (/v1/completions)
    model: str
    params: SamplingParams
    messages: tuple[Message, ...] = ()  # chat
    prompt: str | tuple[int, ...] = ""  # text: a string, or token ids
    seed: int | None = None  # None: a fresh one
    max_tokens: int | None = None  # None: up to the end of the context
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    ignored: tuple[str, ...] = ()  # fields received and ignored: named in the response
    grammar: Grammar | None = None  # response_format json_object / json_schema: the reply is constrained to it
    tools: Tools | None = None  # the functions the model may call, and tool_choice
    logprobs: int = -1  # -1: none; n: each token's log probability (the target's) and its n most likely


def parse_request(kind: str, body: Any) -> CompletionRequest:
    """The checked request; ApiError (400) naming the first field that is wrong or refused."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for name, (neutral, why) in REFUSED[kind].items():
        if name in body and not neutral(body[name]):
            raise bad_request(f"`{name}` is not supported: {why}", name, "unsupported_parameter")
    if _number(body, "n", whole=True) not in (None, 1):
        raise bad_request("`n` must be 1: this endpoint makes one completion a request", "n", "unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required: the name GET /v1/models lists", "model")
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("`stream_options` is only allowed when `stream` is true", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object such as {\"include_usage\": true}", "stream_options")
    include_usage = _bool(options or {}, "include_usage", "stream_options.include_usage")
    ignored = tuple(sorted(name for name in body if name not in SUPPORTED[kind] and name not in REFUSED[kind]))
    common = dict(kind=kind, model=model, params=_sampling(body), seed=_seed(body), max_tokens=_max_tokens(kind, body),
                  stops=_stops(body), stream=stream, include_usage=include_usage)
    if kind == "chat":
        messages, message_ignored = _messages(body)
        tools = parse_tools(body)
        grammar = _response_format(body.get("response_format"))
        if tools is not None and tools.constrained:
            if grammar is not None:
                raise bad_request("`response_format` and a `tool_choice` that forces a call both constrain the "
                                  "reply: send one of them", "response_format", "unsupported_parameter")
            grammar = tools.grammar()
        elif tools is not None and grammar is None:  # "auto": a call the model starts is held to the tools' schemas
            grammar = tools.grammar()
        return CompletionRequest(messages=messages, ignored=ignored + message_ignored, grammar=grammar, tools=tools,
                                 logprobs=_chat_logprobs(body), **common)
    return CompletionRequest(prompt=_prompt(body), ignored=ignored, logprobs=_text_logprobs(body), **common)


# ---- fields -------------------------------------------------------------------------

def _number(body: dict, name: str, whole: bool = False, label: str | None = None):
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, int) if whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise bad_request(f"`{label or name}` must be {'a whole number' if whole else 'a number'}, got {value!r}",
                          label or name)
    return value


def _bool(body: dict, name: str, label: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"`{label or name}` must be true or false, got {value!r}", label or name)
    return value


def _sampling(body: dict) -> SamplingParams:
    temperature = _number(body, "temperature")
    top_p = _number(body, "top_p")
    top_k = _number(body, "top_k", whole=True)
    params = SamplingParams(temperature=float(DEFAULT_TEMPERATURE if temperature is None else temperature),
                            top_k=0 if top_k is None else top_k, top_p=1.0 if top_p is None else float(top_p))
    if not 0.0 <= params.temperature <= MAX_OPENAI_TEMPERATURE:
        raise bad_request(f"`temperature` must be between 0 and 2, got {temperature}", "temperature")
    for problem in params.problems():  # each names its field first
        raise bad_request(problem, problem.split()[0])
    return params


def _seed(body: dict) -> int | None:
    seed = _number(body, "seed", whole=True)
    if problem := seed_problem(seed):
        raise bad_request(f"`seed`: {problem}", "seed")
    return seed


def _max_tokens(kind: str, body: dict) -> int | None:
    values = {name: _number(body, name, whole=True) for name in ("max_tokens", "max_completion_tokens")
              if kind == "chat" or name == "max_tokens"}
    given = {name: value for name, value in values.items() if value is not None}
    if len(set(given.values())) > 1:
        raise bad_request("`max_tokens` and `max_completion_tokens` differ: send one of them",
                          "max_completion_tokens")
    for name, value in given.items():
        if value < 1:
            raise bad_request(f"`{name}` must be at least 1, got {value}", name)
        return value
    return None


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(each, str) for each in stops):
        raise bad_request(f"`stop` must be a string or a list of strings, got {stop!r}", "stop")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"`stop` takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    if any(each == "" for each in stops):
        raise bad_request("`stop` strings must not be empty", "stop")
    return tuple(stops)


def _chat_logprobs(body: dict) -> int:
    """Chat: `logprobs` true asks for each token's; `top_logprobs` (0 to 20, needs it) for the most likely."""
    asked = _bool(body, "logprobs")
    top = _number(body, "top_logprobs", whole=True)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad_request(f"`top_logprobs` must be 0 to {MAX_TOP_LOGPROBS}, got {top}", "top_logprobs")
    if top and not asked:
        raise bad_request("`top_logprobs` needs `logprobs: true`", "top_logprobs")
    return (top or 0) if asked else -1


def _text_logprobs(body: dict) -> int:
    """Completions: `logprobs` n (0 to 5) asks for each token's and the n most likely."""
    n = _number(body, "logprobs", whole=True)
    if n is not None and not 0 <= n <= MAX_TEXT_LOGPROBS:
        raise bad_request(f"`logprobs` must be 0 to {MAX_TEXT_LOGPROBS}, got {n}", "logprobs")
    return -1 if n is None else n


def _response_format(value: Any) -> Grammar | None:
    """The grammar a `response_format` asks for: none for text, any JSON object, or a JSON schema
    (applied whole, strict or not: every reply token is masked by it)."""
    field = "response_format"
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    if kind != "json_schema":
        raise bad_request(f"`{field}.type` must be text, json_object or json_schema, got {kind!r}", f"{field}.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise bad_request(f"`{field}.json_schema` must be an object with a `schema` object (and a `name`)",
                          f"{field}.json_schema")
    grammar = Grammar("json_schema", json.dumps(spec.get("schema", {}), separators=(",", ":")))
    for problem in grammar_problems(grammar):
        raise bad_request(f"`{field}.json_schema.schema`: {problem}", f"{field}.json_schema.schema")
    return grammar


def _messages(body: dict) -> tuple[tuple[Message, ...], tuple[str, ...]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` is required: a list of {\"role\": ..., \"content\": ...} objects", "messages")
    checked, ignored = [], []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"`{where}` must be an object with `role` and `content`", where)
        for name, why in MESSAGE_REFUSED.items():
            if message.get(name):
                raise bad_request(f"`{where}.{name}`: {why}", f"{where}.{name}", "unsupported_parameter")
        role = message.get("role")
        if role not in ROLES:
            hint = " (the legacy functions API is not served: send role tool)" if role == "function" else ""
            raise bad_request(f"`{where}.role` must be one of system, developer, user, assistant, tool; "
                              f"got {role!r}{hint}", f"{where}.role")
        calls = message.get("tool_calls") or []
        if role == "assistant" and calls:
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      and isinstance(c["function"].get("name"), str) for c in calls):
                raise bad_request(f"`{where}.tool_calls` must be a list of {{\"type\": \"function\", \"function\": "
                                  "{\"name\": ..., \"arguments\": ...}} objects", f"{where}.tool_calls")
        call_id = message.get("tool_call_id") or ""
        if not isinstance(call_id, str):
            raise bad_request(f"`{where}.tool_call_id` must be a string", f"{where}.tool_call_id")
        checked.append(Message(ROLES[role], _content(message.get("content"), role, where),
                               tuple(calls) if role == "assistant" else (), call_id if role == "tool" else ""))
        ignored += [f"{where}.{name}" for name in message if name not in MESSAGE_FIELDS and name not in MESSAGE_REFUSED]
    return tuple(checked), tuple(ignored)


def _content(content: Any, role: str, where: str) -> str:
    """A message's text: a string, or a list of text parts (joined by newlines, as vLLM does)."""
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if not isinstance(content, list):
        raise bad_request(f"`{where}.content` must be a string or a list of text parts, got {content!r}",
                          f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            what = f"`{kind}` parts are" if isinstance(kind, str) else "this part is"
            raise bad_request(f"`{at}`: {what} not supported: this endpoint serves a text model; send "
                              "{\"type\": \"text\", \"text\": ...} parts or a string", at, "unsupported_content")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"`{at}.text` must be a string", f"{at}.text")
        texts.append(part["text"])
    return "\n".join(texts)


def _prompt(body: dict) -> str | tuple[int, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("`prompt` is empty: give the text to continue", "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"`prompt` holds {len(prompt)} prompts: one prompt a request here (n = 1, no batches)",
                          "prompt", "unsupported_parameter")
    raise bad_request("`prompt` is required: a string (or a list of token ids)", "prompt")
