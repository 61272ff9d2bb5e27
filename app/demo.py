"""`specwire demo`: the whole pipeline on one machine, on the default pair (or tiny models).

Fetches the default pair if it is missing (or builds the tiny models with --tiny), starts
a verification service on 127.0.0.1 in a child process, and generates each demo prompt
greedily three ways: the service streaming alone (`--mode server`, what any remote model
API gives), one round trip a token (k = 0), and the default mode (the service streams, the
drafter guesses ahead while that pays: one controller learning across the prompts and
starting from what it learned last time). It shows that the tokens are identical, what
speculation saved the service (target passes per token), and says plainly which way was
fastest on this machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from app.generation_flags import k_flag
from app.threads_flags import add_draft_threads_argument, colocated_serve_flags
from app.user_error import UserError
from wire.threads import DRAFT_THREADS

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
DEMO_PROMPTS = ["def quicksort(arr):", CHAT.format("What does a Python decorator do?"), "The quick brown fox"]


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the whole pipeline on this machine, target alone vs speculation")
    demo.add_argument("--k", type=k_flag, default=None, metavar="N|auto",
                      help="guesses the default mode keeps ahead of the stream (default: auto: while that pays)")
    demo.add_argument("--max-tokens", type=int, default=64)
    demo.add_argument("--tiny", action="store_true", help="tiny random models instead of the default pair")
    add_draft_threads_argument(demo)  # the service gets the physical cores left
    demo.set_defaults(run=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    try:
        return run_demo(k=args.k, max_tokens=args.max_tokens, tiny=args.tiny, draft_threads=args.draft_threads)
    except subprocess.CalledProcessError as exc:
        raise UserError(f"the demo could not prepare its models ({exc})") from exc


def start_service(target: Path, *options: str, cpus: set[int] | None = None) -> tuple[subprocess.Popen, str]:
    """Start `specwire serve` (with more `options`, on `cpus` if given) on a free loopback port.

    Returns the process and its URL. The service stops when this process ends, however it
    ends (SIGTERM, a crash, kill -9): it watches a pipe from us (`--exit-with-parent`), whose
    end the kernel closes when we are gone.
    """
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--target", str(target), "--port", "0", "--exit-with-parent",
         *options],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=pin)
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError("the verification service did not start (see the messages above)")
    return process, line.split()[-1]


def demo_models(tiny: bool) -> tuple[Path, Path]:
    """(draft, target) paths: the tiny models, built, or the default pair, fetched."""
    cli = [sys.executable, "-m", "app.cli", "models"]
    from models.registry import file_path, get_pair, models_dir

    if tiny:
        tiny_dir = models_dir() / "tiny"
        subprocess.run(cli + ["tiny", str(tiny_dir)], check=True, stdout=subprocess.DEVNULL)
        return tiny_dir / "draft.gguf", tiny_dir / "target"

    subprocess.run(cli + ["fetch"], check=True)
    pair = get_pair()
    return file_path(pair, pair.draft), file_path(pair, pair.target)


def explain_divergence(target_path: Path, context: list[int], alone: list[int], hybrid: list[int]) -> str:
    """Where the two outputs part, and how far apart the target scores the two tokens there.

    The service verifies with batch-invariant kernels (docs/how-it-works.md, "Batch-invariant
    kernels"), so this is a fault to report, whatever the gap: a service started with
    --no-batch-invariant, or a llama.cpp build with llamafile's kernels, can resolve a
    near-tie differently.
    """
    from remote_verify.backends.factory import load_backend

    at = next(i for i, (a, b) in enumerate(zip(alone, hybrid)) if a != b)
    backend = load_backend("auto", target_path, device="cpu")
    logits = backend.forward(backend.new_cache(), context + alone[:at], n_logits=1)[0]
    gap = abs(float(logits[alone[at]] - logits[hybrid[at]]))
    return f"NO: differs at token {at} (logit gap {gap:.2f})"


def run_demo(k: int | None, max_tokens: int, tiny: bool, draft_threads: int = DRAFT_THREADS) -> int:
    from local_draft.controller_memory import ControllerMemory
    from local_draft.draft_model import DraftModel
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.speculator import Speculator
    from local_draft.stream_speculator import StreamSpeculator
    from local_draft.verify_client import VerifyClient
    from wire.protocol import SamplingParams

    draft_path, target_path = demo_models(tiny)
    print(f"starting a verification service for {target_path.name} ...", flush=True)
    # one machine, two llama.cpp models: the drafter's threads, and the service's share (wire/threads.py)
    service, url = start_service(target_path, *colocated_serve_flags(draft_threads))
    print(f"verification service listening on {url}\n", flush=True)
    try:
        draft = DraftModel(draft_path, n_threads=draft_threads)
        params = SamplingParams()  # greedy: output must equal the target's token for token
        client = VerifyClient(url, draft.hello(params, client="specwire demo"))
        default = StreamSpeculator(draft, client, params, max_block=k)
        memory = ControllerMemory(url, draft.path.name, client.welcome.target, mode="hybrid")
        memory.load_into(default.controller)
        ways = [("server", ServerOnlyGenerator(client, draft.end_ids)),
                ("k=0", Speculator(draft, client, params, k=0)),
                ("default" if k is None else f"k={k}", default)]
        totals = {name: [0, 0.0] for name, _ in ways}  # tokens, seconds
        header = (f"{'prompt':28s} {'mode':8s} {'tokens':>6s} {'passes':>6s} {'accept':>7s} {'pass/tok':>8s} "
                  f"{'tok/s':>7s}")
        print(header + "  same tokens\n" + "-" * (len(header) + 13))
        for prompt in DEMO_PROMPTS:
            ids = draft.tokenize(prompt)
            results = [(name, generator.generate(ids, max_tokens)) for name, generator in ways]
            alone = results[0][1]
            label = prompt.replace("<|im_start|>user\n", "[chat] ").splitlines()[0][:28]
            for name, result in results:
                s = result.stats
                totals[name][0] += s.generated
                totals[name][1] += s.wall_s
                same = ""
                if result is not alone:
                    same = "yes" if result.token_ids == alone.token_ids else explain_divergence(
                        target_path, ids, alone.token_ids, result.token_ids)
                print(f"{label:28s} {name:8s} {s.generated:6d} {s.verified_rounds:6d} {s.acceptance_rate:7.2f} "
                      f"{s.verified_rounds / max(s.generated, 1):8.2f} {s.tokens_per_s:7.1f}  {same}")
            text = b"".join(draft.token_bytes(t) for t in results[-1][1].token_ids).decode("utf-8", "replace")
            print(f"    -> {text[:150]!r}")
        memory.save(default.controller)
        client.close()
        rates = {name: tokens / seconds for name, (tokens, seconds) in totals.items() if seconds}
        fastest = max(rates, key=rates.get)
        print("\nover the three prompts: " + ", ".join(f"{name} {rate:.1f} tokens/s" for name, rate in rates.items())
              + f". Fastest on this machine: {fastest}.")
        if fastest == "server" or rates.get(ways[-1][0], 0) < rates["server"]:
            print("Here the service streaming alone is as fast as speculation gets: the drafter shares this "
                  "machine's cores with the service, and a pass over a block costs about as much as a token each. "
                  "Speculation pays where the target runs on a GPU (a pass of 16 tokens costs about one).")
        if tiny:
            print("\nThe tiny models are random weights: the text is noise, the machinery is real.")
    finally:
        service.terminate()
        service.wait(timeout=30)
    return 0
