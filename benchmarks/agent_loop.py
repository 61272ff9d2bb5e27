"""A tool-using agent loop of a dozen steps on the default pair, through `specwire api` and `openai`.

    python -m benchmarks.agent_loop [--steps 12] [--steps-per-task 3] [--max-tokens 160]
        [--json results.json]

Starts `specwire api` on the default pair (Qwen2.5-Coder 0.5B drafting, 1.5B verifying in an
embedded service, from the model cache), and runs what an agent runs: chat completions with
`tools` and `tool_choice: auto`, greedy, each call the model makes executed here and its result
sent back as a `role: tool` message, until the model answers in text or the task has had
`--steps-per-task` requests; then the next task, until `--steps` requests were made. The tools work on a small in-memory project (list the files, read
one, evaluate arithmetic). Per step it reports the calls made, whether each call's arguments
validate against its tool's parameters, the reply's tokens, seconds and the guesses kept; at the
end, the totals, and whether each task's answer holds the expected number.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import operator
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("agent_loop")

FILES = {"prices.txt": "apple 3\npear 5\nplum 7\n", "counts.txt": "apple 4\npear 2\nplum 10\n",
         "README.md": "Shop data: prices.txt has each fruit's price, counts.txt how many were sold.\n"}
TOOLS = [
    {"type": "function", "function": {
        "name": "list_files", "description": "List the files in the project.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the project.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": sorted(FILES)}},
                       "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "calculate", "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "pattern": "^[0-9+*/() .-]{1,60}$"}},
            "required": ["expression"], "additionalProperties": False}}},
]
TASKS = [  # (the user's request, a number the final answer must hold)
    ("What files are in the project? Use the tools.", None),
    ("What is the price of a plum? Read the file.", "7"),
    ("How much money did the shop make from pears? Read both files and use calculate.", "10"),
    ("How much money did the shop make from apples and plums together? Use the tools.", "82"),
    ("How many fruits were sold in total? Use calculate.", "16"),
]
SYSTEM = "You are a careful assistant. Use the tools to find facts; do not guess. Answer briefly."
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """Arithmetic only, by walking the expression's syntax tree (never eval)."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("not arithmetic")
    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(result) if float(result).is_integer() else result)


def run_tool(name: str, arguments: dict) -> str:
    if name == "list_files":
        return "\n".join(sorted(FILES))
    if name == "read_file":
        return FILES.get(arguments.get("path", ""), "error: no such file")
    if name == "calculate":
        return calculate(str(arguments.get("expression", "")))
    return f"error: no tool {name}"


def start_api() -> tuple[subprocess.Popen, str]:
    specwire = str(Path(sys.executable).parent / "specwire")
    process = subprocess.Popen([specwire, "api", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    line = process.stdout.readline()
    if not line.startswith("listening on http://"):
        process.kill()
        raise SystemExit(f"specwire api did not start: {line!r}")
    return process, line.split()[-1]


def main() -> None:
    import jsonschema
    import openai

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--steps-per-task", type=int, default=3,
                        help="a task that has not been answered after this many requests gives way to the next")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--json", help="write every step's record here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    process, url = start_api()
    api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    parameters = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    steps, answers = [], []
    try:
        for task, expected in TASKS:
            if len(steps) >= args.steps:
                break
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
            for _ in range(args.steps_per_task):
                if len(steps) >= args.steps:
                    break
                began = time.perf_counter()
                answer = api.chat.completions.create(model="specwire", messages=messages, tools=TOOLS,
                                                     tool_choice="auto", temperature=0, max_tokens=args.max_tokens)
                seconds = time.perf_counter() - began
                choice, extra = answer.choices[0], answer.model_extra["specwire"]
                calls = choice.message.tool_calls or []
                valid = []
                for call in calls:
                    try:
                        jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])
                        valid.append(True)
                    except (ValueError, KeyError, jsonschema.ValidationError):
                        valid.append(False)
                steps.append({"task": task, "finish_reason": choice.finish_reason,
                              "calls": [f"{c.function.name}({c.function.arguments})" for c in calls],
                              "arguments_valid": valid, "tokens": answer.usage.completion_tokens,
                              "seconds": round(seconds, 2), "drafted": extra["drafted"], "accepted": extra["accepted"],
                              "target_passes": extra["target_passes"], "verified": extra["verified"]})
                log.info("step %d: %s %s, %d tokens in %.1f s, %d of %d guesses kept", len(steps),
                         choice.finish_reason, steps[-1]["calls"] or repr((choice.message.content or "")[:80]),
                         steps[-1]["tokens"], seconds, extra["accepted"], extra["drafted"])
                if not calls:
                    text = choice.message.content or ""
                    answers.append({"task": task, "answer": text, "expected": expected,
                                    "holds_expected": expected is None or expected in text})
                    break
                messages.append({"role": "assistant", "content": choice.message.content,
                                 "tool_calls": [c.model_dump() for c in calls]})
                for call in calls:
                    try:
                        result = run_tool(call.function.name, json.loads(call.function.arguments))
                    except ValueError:
                        result = "error: the arguments are not JSON"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    finally:
        process.terminate()
        process.wait(30)
    calls = sum(len(s["calls"]) for s in steps)
    valid = sum(sum(s["arguments_valid"]) for s in steps)
    tokens, seconds = sum(s["tokens"] for s in steps), sum(s["seconds"] for s in steps)
    drafted, accepted = sum(s["drafted"] for s in steps), sum(s["accepted"] for s in steps)
    print(f"{len(steps)} steps, {calls} tool calls ({valid} with valid arguments), "
          f"{len(answers)} tasks answered ({sum(a['holds_expected'] for a in answers)} holding the expected number); "
          f"{tokens} tokens in {seconds:.1f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s with prompts), "
          f"{accepted} of {drafted} guesses kept; every reply verified: {all(s['verified'] for s in steps)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": steps, "answers": answers}, indent=1))


if __name__ == "__main__":
    main()
