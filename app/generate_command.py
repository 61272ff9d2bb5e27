"""`specwire generate`: continue one prompt (hybrid, server-only or offline) and report statistics."""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys

from app.generation_flags import add_k_argument, add_mix_argument, add_sampling_arguments, drafting, sampling_params
from app.model_paths import resolve_model
from app.tokenizer_source import load_tokenizer
from app.threads_flags import add_draft_threads_argument
from app.token_file import read_token_file
from app.user_error import UserError
from wire.visible_text import visible


def register(sub: argparse._SubParsersAction) -> None:
    env = os.environ.get
    gen = sub.add_parser("generate", help="generate a continuation of one prompt")
    gen.add_argument("--draft", help="draft model GGUF file (default: the draft of --pair), or `ngram`: draft by "
                     "copying the context, with no model at all (a lost service is then an error)")
    gen.add_argument("--tokenizer", help="with --draft ngram: the GGUF whose vocabulary tokenizes (default: "
                     "the service's, else the draft of --pair; only its vocabulary is read)")
    add_mix_argument(gen)
    gen.add_argument("--pair", default=env("SPECWIRE_PAIR"), help="model pair (default: the default pair)")
    where = gen.add_mutually_exclusive_group()
    where.add_argument("--server", default=env("SPECWIRE_SERVER", "ws://127.0.0.1:8765"),
                       help="ws://HOST:PORT of a verification service (default: %(default)s)")
    where.add_argument("--offline", action="store_true", help="draft model alone, no verification "
                       "(the same as --mode offline)")
    gen.add_argument("--mode", choices=["hybrid", "rounds", "server", "offline"], default="hybrid",
                     help="hybrid: the service streams the target's tokens and verifies the drafter's guesses "
                          "as they arrive (default); rounds: draft a block, wait for its verdict, repeat; "
                          "server: the service generates alone and streams (no draft model runs); offline: "
                          "the draft model alone")
    gen.add_argument("--token-file", default=env("SPECWIRE_TOKEN_FILE"))
    gen.add_argument("--ca-file", default=env("SPECWIRE_CA_FILE"),
                     help="CA certificates to trust for a wss:// service (default: the system's)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=128)
    add_sampling_arguments(gen)
    add_k_argument(gen)
    gen.add_argument("--no-pipeline", dest="pipeline", action="store_false",
                     help="--mode rounds: do not draft the next block while a verdict is in flight")
    gen.add_argument("--draft-gpu-layers", type=int, default=-1,
                     help="layers of the draft model on the GPU (-1: all, 0: none)")
    add_draft_threads_argument(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, token ids and stats")
    gen.add_argument("--raw", action="store_true",
                     help="write the model's bytes as they are, control characters too (default: on a terminal, "
                          "control characters are shown as symbols, so model output cannot act on the terminal)")
    gen.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from local_draft.controller_memory import ControllerMemory
    from local_draft.draft_model import DraftModel, DraftModelError
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.service_link import TAKEOVER_WAIT_S, LinkState, ServiceLink
    from local_draft.speculator import Speculator
    from local_draft.stream_speculator import StreamSpeculator
    from local_draft.verify_client import ServiceUnreachable, VerifyError
    from wire.randomness import fresh_seed

    params = sampling_params(args)
    mode = "offline" if args.offline else args.mode
    how = drafting(args)  # "model", "mixed" or "ngram"
    # A streamed reply's draws are keyed by its seed, which the drafter needs too (to guess them):
    # one is made here when none is given, and the service gets it in the handshake.
    seed = args.seed if args.seed is not None or mode != "hybrid" else fresh_seed()
    if how == "ngram" and mode not in ("hybrid", "rounds"):
        raise UserError(f"--draft ngram drafts for a service to verify: it cannot run in --mode {mode} "
                        "(no model to generate offline; --mode server needs no drafter)")
    if how == "ngram":  # no model at all: a vocabulary to tokenize with
        draft = load_tokenizer(args.tokenizer, args.pair, args.server, read_token_file(args.token_file), args.ca_file)
    else:
        try:  # server mode runs no draft model: its vocabulary is enough to tokenize
            draft = DraftModel(resolve_model(args.draft, args.pair, "draft"), gpu_layers=args.draft_gpu_layers,
                               n_threads=args.draft_threads, vocab_only=mode == "server")
        except DraftModelError as exc:
            raise UserError(str(exc)) from exc

    def report_link(state: LinkState) -> None:
        print(f"[{state.detail}]", file=sys.stderr, flush=True)

    link = None
    if mode != "offline":
        try:
            link = ServiceLink(args.server, draft.hello(params, seed=seed, client="specwire generate"),
                               token=read_token_file(args.token_file), ca_file=args.ca_file, on_state=report_link,
                               takeover_wait_s=TAKEOVER_WAIT_S)
        except (ServiceUnreachable, VerifyError) as exc:
            raise UserError(f"{exc}" + ("" if how == "ngram" else " (or run with --offline)")) from exc

    prompt = draft.tokenize(args.prompt)
    if mode == "server":
        generator = ServerOnlyGenerator(link, draft.end_ids)
    elif mode == "hybrid":
        # a service lost with no model (--draft ngram) ends the run with an error, at once; with
        # one, the reply waits a moment (the link's takeover_wait_s) for a replica to take over
        # before it goes on offline
        generator = StreamSpeculator(draft, link, params, seed=seed, max_block=args.k, drafting=how,
                                     end_ids=draft.end_ids)
    else:
        generator = Speculator(draft, link, params, k=args.k, seed=seed, pipeline=args.pipeline,
                               drafting=how, end_ids=draft.end_ids)
    memory = None
    if mode in ("hybrid", "rounds"):  # the controller starts from what it learned last time with this service and pair
        drafter = "ngram" if how == "ngram" else draft.path.name
        memory = ControllerMemory(args.server, drafter, link.welcome.target, mode=mode)
        memory.load_into(generator.controller)
    provenance_runs: list[list] = []  # [provenance, count] runs: which tokens were verified
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    # model text on a terminal: an escape sequence in a reply must not act on it (a pipe gets what was written)
    shown = visible if sys.stdout.isatty() and not args.raw else str

    def stream(tokens: list[int], provenance: list[str]) -> None:
        for mark in provenance:
            if provenance_runs and provenance_runs[-1][0] == mark:
                provenance_runs[-1][1] += 1
            else:
                provenance_runs.append([mark, 1])
        if not args.json:
            sys.stdout.write(shown(decoder.decode(b"".join(draft.token_bytes(t) for t in tokens))))
            sys.stdout.flush()

    try:
        result = generator.generate(prompt, args.max_tokens, on_commit=stream)
    except (ServiceUnreachable, VerifyError) as exc:
        raise UserError(str(exc)) from exc
    finally:
        if link is not None:
            link.close()
    if memory is not None:
        memory.save(generator.controller)

    text = b"".join(draft.token_bytes(t) for t in result.token_ids).decode("utf-8", errors="replace")
    stats = result.stats
    if args.json:
        print(json.dumps({
            "text": text, "token_ids": result.token_ids, "prompt_tokens": len(prompt),
            "stop_reason": result.stop_reason, "mode": mode,
            "drafting": how if mode in ("hybrid", "rounds") else None,
            "k": "auto" if args.k is None else args.k, "provenance": provenance_runs, "stats": stats.as_dict(),
        }))
    else:
        sys.stdout.write(shown(decoder.decode(b"", final=True)) + "\n")
        print(f"[stopped at {result.stop_reason}: {stats.generated} tokens in {stats.wall_s:.2f} s, "
              f"{stats.rounds} rounds, {stats.verified_rounds} target passes, acceptance {stats.acceptance_rate:.2f}, "
              f"{stats.tokens_per_round:.2f} tokens/round, {stats.tokens_per_s:.1f} tokens/s"
              + (f", {stats.offline} unverified (offline)" if stats.offline else "") + "]", file=sys.stderr)
        if stats.by_source:
            print("[by drafter: " + ", ".join(f"{source} {c.accepted}/{c.drafted} accepted in {c.rounds} rounds"
                                               for source, c in sorted(stats.by_source.items())) + "]",
                  file=sys.stderr)
        print(f"[time: draft {stats.draft_s:.2f} s (+{stats.ahead_s:.2f} s drafted ahead), wire {stats.wire_s:.2f} s, "
              f"service {stats.service_s:.2f} s (queue {stats.queue_s:.2f}, forward {stats.forward_s:.2f})]",
              file=sys.stderr)
    return 0
