"""The endpoint against `specwire generate`: the same request, side by side, and N clients at once.

    .venv/bin/python -m benchmarks.api [--models default|tiny] [--repeat 2] [--max-tokens 96]
                                       [--concurrent 4 --drafters 1,2,4]

One `specwire serve` for the pair's target is started (with the thread flags the chat
gives its embedded service), and `specwire api --server` it. Then, alternating so that both
meet the same machine, for each question (a chat message, greedy):
- `specwire generate --json`, default mode (adaptive k, drafting ahead), its prompt the
  chat template's text for that message: its own statistics give its time to first token
  and tokens/s, counted from the start of its generation, after it loaded its drafter and
  connected (the endpoint pays for its connection in every request: the comparison
  charges the endpoint everything);
- the same message through the openai package, streaming: time to first token from
  sending the request to the first text, tokens/s = tokens / (sending -> last chunk).
Each pair of replies must be token-identical. Prints every run and the median ratios
(the Targets: tokens/s at least 0.95x, time to first token at most +50 ms).

With --drafter-costs: what the rule for sharing drafters rests on, timed on the drafter alone:
how long it takes to read a request's prompt (what handing one drafter to another request
round by round would cost at every switch), and milliseconds per drafted token with one, two
and four drafters drafting at once in one process (what a pool of drafters costs on this
machine's cores).

With --concurrent N: N streaming clients at once, for each --drafters count (a fresh
`specwire api` each), and the same N requests one after another (what a queue for one
drafter would give): wall time until all finish, aggregate tokens/s, mean time to first
token, each reply checked against the sequential one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the difference between a list and a tuple in Python?",
    "def quicksort(arr):",
    "Explain in two sentences what a hash map is.",
]


@dataclass
class Run:
    first_token_s: float
    tokens_per_s: float
    token_ids: list[int]
    # the endpoint's own figures: (setup s: prompt, drafter, session; its generation's first token s, tokens/s)
    generation: tuple[float, float, float] = (0.0, 0.0, 0.0)


def models(which: str) -> tuple[Path, Path]:
    """(draft GGUF, target) of the default pair, or of tiny models built into a temporary folder."""
    if which == "tiny":
        from models.tiny import build_tiny_models

        tiny = build_tiny_models(Path(tempfile.mkdtemp(prefix="specwire-bench-api-")), seed=0)
        return tiny.draft, tiny.target_gguf
    from models.registry import get_pair, require_file

    pair = get_pair()
    return require_file(pair, pair.draft), require_file(pair, pair.target)


def start(command: list[str], ready: str) -> tuple[subprocess.Popen, str]:
    """A child process (ended with us: --exit-with-parent or our cleanup) and the URL on its ready line."""
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if not line.startswith(ready):
        process.kill()
        raise SystemExit(f"{command[3]} did not start: {line!r}")
    return process, line.split()[-1]


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()


def chat_text(draft: Path, question: str) -> str:
    """The prompt text the draft GGUF's chat template makes of one user message (as the endpoint does)."""
    from local_draft.chat_template import Message, template_for
    from local_draft.draft_model import DraftModel

    tokenizer = DraftModel(draft, vocab_only=True)
    bos = tokenizer.token_text(tokenizer.bos_id).decode("utf-8", "replace")
    eos = tokenizer.token_text(tokenizer.eos_id).decode("utf-8", "replace")
    return template_for(tokenizer.chat_template, bos, eos).render([Message("user", question)])


def with_generate(draft: Path, url: str, prompt: str, max_tokens: int) -> Run:
    done = subprocess.run([sys.executable, "-m", "app.cli", "generate", "--json", "--server", url,
                           "--draft", str(draft), "--prompt", prompt, "--max-tokens", str(max_tokens)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"generate failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    stats = result["stats"]
    return Run(stats["first_token_s"], stats["tokens_per_s"], result["token_ids"])


def with_endpoint(api_url: str, question: str, max_tokens: int) -> Run:
    import openai

    client = openai.OpenAI(base_url=api_url, api_key="unused", max_retries=0, timeout=900)
    sent = time.perf_counter()
    first = None
    for chunk in client.chat.completions.create(model="specwire", messages=[{"role": "user", "content": question}],
                                                max_tokens=max_tokens, temperature=0, stream=True):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - sent
        if chunk.choices and chunk.choices[0].finish_reason:
            provenance = chunk.model_extra["specwire"]
    wall = time.perf_counter() - sent
    token_ids = provenance["token_ids"]
    return Run(first, len(token_ids) / wall, token_ids,
               (provenance["setup_s"], provenance["first_token_s"], provenance["tokens_per_s"]))


def side_by_side(draft: Path, url: str, api_url: str, repeat: int, max_tokens: int) -> None:
    """Each question `repeat` times each way, alternating; the Targets' ratios, and what the endpoint adds
    around its own generation (measured within each request, so the machine's noise cancels out)."""
    tps_ratios, ttft_added, own_ratios, own_added = [], [], [], []
    print("| question | run | generate tok/s | endpoint tok/s | ratio | generate TTFT | endpoint TTFT | added "
          "| endpoint's setup; its generation's TTFT, tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for index, question in enumerate(QUESTIONS[:3]):
        prompt = chat_text(draft, question)
        for run in range(repeat):
            # alternate which goes first: a machine that slows down mid-run favours neither
            if run % 2 == 0:
                generated = with_generate(draft, url, prompt, max_tokens)
                served = with_endpoint(api_url, question, max_tokens)
            else:
                served = with_endpoint(api_url, question, max_tokens)
                generated = with_generate(draft, url, prompt, max_tokens)
            if generated.token_ids != served.token_ids:
                raise SystemExit(f"question {index}: the endpoint's reply differs from generate's")
            tps_ratios.append(served.tokens_per_s / generated.tokens_per_s)
            ttft_added.append(served.first_token_s - generated.first_token_s)
            setup, own_first, own_tps = served.generation
            own_ratios.append(served.tokens_per_s / own_tps)
            own_added.append(served.first_token_s - own_first)
            print(f"| {index} | {run} | {generated.tokens_per_s:.2f} | {served.tokens_per_s:.2f} | "
                  f"{tps_ratios[-1]:.3f} | {generated.first_token_s * 1000:.0f} ms | "
                  f"{served.first_token_s * 1000:.0f} ms | {ttft_added[-1] * 1000:+.0f} ms | "
                  f"{setup * 1000:.0f} ms; {own_first * 1000:.0f} ms, {own_tps:.2f} |", flush=True)
    median = statistics.median
    print(f"\nmedian over {len(tps_ratios)} pairs: endpoint tokens/s {median(tps_ratios):.3f}x generate's "
          f"(target >= 0.95); time to first token {median(ttft_added) * 1000:+.0f} ms (target <= +50 ms); "
          f"every reply token-identical")
    print(f"what the endpoint adds around its own generation (HTTP, prompt, its service session, the stream): "
          f"tokens/s {median(own_ratios):.3f}x (worst {min(own_ratios):.3f}x), time to first token "
          f"{median(own_added) * 1000:+.0f} ms (worst {max(own_added) * 1000:+.0f} ms)", flush=True)


def concurrent(draft: Path, url: str, clients: int, drafters: list[int], max_tokens: int) -> None:
    questions = (QUESTIONS * clients)[:clients]
    print(f"\n{clients} streaming clients, {max_tokens} tokens each, greedy")
    print("| how | wall s | aggregate tok/s | mean TTFT s | modes |")
    print("|---|---|---|---|---|")
    reference = None
    for count in [None, *drafters]:  # None: one after another, one drafter
        process, api_url = start([sys.executable, "-m", "app.cli", "api", "--port", "0", "--server", url, "--draft",
                                  str(draft), "--drafters", str(count or 1)], "listening on http://")
        try:
            results: list = [None] * clients
            started = time.perf_counter()
            if count is None:
                for i, question in enumerate(questions):
                    results[i] = stream_one(api_url, question, max_tokens, started)
            else:
                threads = [threading.Thread(target=lambda i=i, q=q: results.__setitem__(
                    i, stream_one(api_url, q, max_tokens, started))) for i, q in enumerate(questions)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            wall = time.perf_counter() - started
        finally:
            stop(process)
        tokens = [r[1] for r in results]
        verified = [t if "unverified" not in r[2] else None for t, r in zip(tokens, results)]
        if reference is None:
            reference = verified
        elif any(t != r for t, r in zip(verified, reference) if t and r):  # unverified replies are no reference
            raise SystemExit(f"--drafters {count}: a verified reply differs from the same request made alone")
        modes = ",".join(sorted({r[2] for r in results}))
        how = "one after another" if count is None else f"at once, --drafters {count}"
        firsts = [r[0] for r in results if r[0] is not None]
        print(f"| {how} | {wall:.1f} | {sum(len(t) for t in tokens) / wall:.2f} | "
              f"{statistics.mean(firsts) if firsts else float('nan'):.2f} | {modes} |", flush=True)


def stream_one(api_url: str, question: str, max_tokens: int, started: float) -> tuple[float, list[int], str]:
    """(time to first text from `started`, token ids, mode) of one streamed request; a failure is mode
    "failed: ..." and no tokens."""
    import openai

    client = openai.OpenAI(base_url=api_url, api_key="unused", max_retries=0, timeout=900)
    first = None
    try:
        for chunk in client.chat.completions.create(model="specwire", max_tokens=max_tokens, temperature=0,
                                                    messages=[{"role": "user", "content": question}], stream=True):
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
            if chunk.choices and chunk.choices[0].finish_reason:
                provenance = chunk.model_extra["specwire"]
    except openai.APIError as exc:
        return first, [], f"failed: {exc}"
    mode = provenance["mode"] + ("" if provenance["verified"] else f" ({provenance['unverified_tokens']} unverified)")
    return first, provenance["token_ids"], mode


def drafter_costs(draft: Path, blocks: int = 5, block: int = 8) -> None:
    """Prompt reading (a switch of requests) and drafting speed with 1, 2 and 4 drafters at once."""
    from local_draft.draft_model import DraftModel
    from wire.protocol import SamplingParams
    from wire.randomness import draft_generator

    drafters = [DraftModel(draft) for _ in range(4)]
    prompts = [drafters[0].tokenize(chat_text(draft, question)) for question in QUESTIONS]
    reads = []
    for prompt in prompts:
        drafters[0].rollback(0)
        started = time.perf_counter()
        drafters[0].keep_up(prompt)
        reads.append((time.perf_counter() - started, len(prompt)))
    print(f"\nreading a prompt (a switch of requests): {statistics.median(r[0] for r in reads) * 1000:.0f} ms for "
          f"{statistics.median(r[1] for r in reads):.0f} tokens (median of {len(reads)})")
    for count in (1, 2, 4):
        per_token: list[float] = []

        def draft_blocks(model: DraftModel, prompt: list[int]) -> None:
            model.keep_up(prompt)
            context = list(prompt)
            for _ in range(blocks):
                started = time.perf_counter()
                tokens, _ = model.propose(context, block, SamplingParams(), draft_generator(0))
                per_token.append((time.perf_counter() - started) / block)
                context += tokens

        threads = [threading.Thread(target=draft_blocks, args=(drafters[i], prompts[i])) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(f"{count} drafter{'s' if count > 1 else ''} drafting at once: "
              f"{statistics.median(per_token) * 1000:.1f} ms a drafted token each "
              f"(median of {len(per_token)} blocks of {block})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", choices=["default", "tiny"], default="default")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each question, each way")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrent", type=int, default=0, help="also N streaming clients at once")
    parser.add_argument("--drafters", default="1,2", help="with --concurrent: the drafter counts to compare")
    parser.add_argument("--skip-side-by-side", action="store_true", help="only --concurrent and --drafter-costs")
    parser.add_argument("--drafter-costs", action="store_true", help="also time prompt reading and drafters at once")
    args = parser.parse_args()
    from app.threads_flags import colocated_serve_flags
    from wire.threads import DRAFT_THREADS

    # adaptive k's saved state in a file of this run's, shared by generate and the endpoint
    os.environ["SPECWIRE_ADAPTIVE_STATE"] = str(Path(tempfile.mkdtemp(prefix="specwire-bench-api-")) / "k.json")
    draft, target = models(args.models)
    if args.drafter_costs:
        drafter_costs(draft)
    service, url = start([sys.executable, "-m", "app.cli", "serve", "--target", str(target), "--port", "0",
                          "--exit-with-parent", *colocated_serve_flags(DRAFT_THREADS)], "listening on ws://")
    try:
        if not args.skip_side_by_side:
            endpoint, api_url = start([sys.executable, "-m", "app.cli", "api", "--port", "0", "--server", url,
                                       "--draft", str(draft)], "listening on http://")
            try:
                with_endpoint(api_url, QUESTIONS[3], 8)  # a warm-up for each: first loads, first connections
                with_generate(draft, url, chat_text(draft, QUESTIONS[3]), 8)
                side_by_side(draft, url, api_url, args.repeat, args.max_tokens)
            finally:
                stop(endpoint)
        if args.concurrent:
            concurrent(draft, url, args.concurrent, [int(n) for n in args.drafters.split(",")], args.max_tokens)
    finally:
        stop(service)


if __name__ == "__main__":
    main()
