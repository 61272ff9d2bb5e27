"""Tools: checked, shown to the model, a forced call constrained by a grammar, calls read back."""

from __future__ import annotations

import json

import pytest

from app.api.tool_calls import parse_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_tool_choice_defaults_to_auto_and_names_a_function():
    """No tool_choice is auto; a named function becomes function:NAME; none reads no calls."""
    assert parse_tools({"tools": [WEATHER]}).choice == "auto"
    assert parse_tools({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
                       ).choice == "function:get_weather"
    assert not parse_tools({"tools": [WEATHER], "tool_choice": "none"}).reads_calls
    assert parse_tools({"tools": [], "tool_choice": "none"}) is None


def test_a_forced_call_is_a_grammar_over_the_chosen_functions():
    """required: any tool's name with its parameters; named: that one alone."""
    required = json.loads(parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}).grammar().schema)
    assert [option["properties"]["name"]["const"] for option in required["anyOf"]] == ["get_weather", "get_time"]
    named = json.loads(parse_tools({"tools": [WEATHER, TIME], "tool_choice": {
        "type": "function", "function": {"name": "get_time"}}}).grammar().schema)
    assert named["properties"]["name"] == {"const": "get_time"}


def test_auto_holds_a_started_call_to_every_tools_schema_and_none_holds_nothing():
    """auto: the "tool_calls" grammar over all the tools' calls; none: no grammar."""
    auto = parse_tools({"tools": [WEATHER, TIME]}).grammar()
    assert auto.kind == "tool_calls"
    assert [option["properties"]["name"]["const"] for option in json.loads(auto.schema)["anyOf"]] == [
        "get_weather", "get_time"]
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}).grammar() is None


def test_calls_are_read_from_hermes_tags_with_the_text_before_them():
    """auto: each <tool_call> block naming a known function is a call; the text before is the content."""
    tools = parse_tools({"tools": [WEATHER]})
    content, calls = tools.read('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
                                '\n</tool_call>')
    assert content == "Let me look.\n" and len(calls) == 1
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert tools.read('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')[1] == []  # not a tool
    assert tools.read("no call here") == ("no call here", [])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_reply_is_read_as_one_call(choice):
    """A forced call's reply is its JSON alone: one call, no content."""
    tools = parse_tools({"tools": [WEATHER], "tool_choice": choice})
    content, calls = tools.read('{"name":"get_weather","arguments":{"city":"Rome"}}')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}


def test_a_stream_sends_text_up_to_a_call_and_holds_the_call():
    """CallWatch: text goes out as it comes, a tag's possible start is held, and everything from a tag on."""
    from app.api.tool_calls import CallWatch

    watch = CallWatch()
    pieces = ["Let me ", "look <", "tool", "_call>\n{\"name\": ", "\"get_weather\"}"]
    sent = "".join(watch.feed(piece) for piece in pieces)
    assert sent == "Let me look " and watch.calling and watch.held.startswith("<tool_call>")
    loose = CallWatch()
    assert loose.feed("a <") == "a " and loose.feed("br>") == "<br>" and loose.held == ""


def test_a_reply_that_is_one_call_alone_is_a_call_under_auto():
    """auto: a reply that is a call's JSON and nothing else, bare or fenced, is read as that call."""
    tools = parse_tools({"tools": [WEATHER]})
    fenced = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Oslo"}\n}\n```'
    for reply in (fenced, '{"name": "get_weather", "arguments": {"city": "Oslo"}}'):
        content, calls = tools.read(reply)
        assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert tools.read('Use {"name": "get_weather"} like this.')[1] == []  # JSON inside prose is not a call


def test_a_stream_holds_a_reply_that_opens_as_a_bare_call():
    """A reply opening with `{` or a code fence is held whole; one opening with prose goes out."""
    from app.api.tool_calls import CallWatch

    fenced = CallWatch()
    assert fenced.feed("\n`") == "" and fenced.feed("``json\n{") == "" and fenced.calling
    prose = CallWatch()
    assert prose.feed(" ") == "" and prose.feed("Sure, {x}") == " Sure, {x}" and not prose.calling
