"""`specwire chat`: its flags; the chat itself loads only when it runs (app/chat/launch.py)."""

from __future__ import annotations

import argparse
import os

from app.chat.chat_config import FROM_CONFIG
from app.generation_flags import add_k_argument, add_mix_argument, add_sampling_arguments
from app.threads_flags import add_draft_threads_argument

LATEST = ""  # `--resume` without an id: the most recent chat


def register(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser("chat", help="chat in the terminal: hybrid (default), remote (--server) or --offline")
    add_chat_arguments(chat)
    chat.set_defaults(run=chat_command)


def chat_command(args: argparse.Namespace) -> int:
    from app.chat.launch import run_chat  # the chat's modules load only for the chat

    return run_chat(args)


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    models = parser.add_argument_group("models (default: the default pair, verified by an embedded service)")
    models.add_argument("--draft", help="draft model GGUF file (default: the draft of --pair), or `ngram`: draft "
                        "by copying the context, with no model (no offline mode)")
    models.add_argument("--tokenizer", help="with --draft ngram: the GGUF whose vocabulary tokenizes (default: "
                        "a --server's own, else the draft of --pair; only its vocabulary is read)")
    add_mix_argument(models)
    models.add_argument("--target", help="target of the embedded service: a GGUF file or a Hugging Face folder")
    models.add_argument("--pair", default=env("SPECWIRE_PAIR"), help="model pair (default: the default pair)")
    models.add_argument("--backend", default=env("SPECWIRE_BACKEND", "auto"), choices=["auto", "torch", "llamacpp"],
                        help="the embedded service's engine (as for serve)")
    models.add_argument("--draft-gpu-layers", type=int, default=-1,
                        help="layers of the draft model on the GPU (-1: all, 0: none)")
    add_draft_threads_argument(models)  # the embedded service takes the physical cores left
    service = parser.add_argument_group("service")
    service.add_argument("--server", default=env("SPECWIRE_SERVER"),
                         help="ws://HOST:PORT (or wss://) of a remote verification service instead of the embedded one")
    service.add_argument("--token-file", default=env("SPECWIRE_TOKEN_FILE"), help="bearer token for --server")
    service.add_argument("--ca-file", default=env("SPECWIRE_CA_FILE"), help="CA certificates for a wss:// --server")
    service.add_argument("--offline", action="store_true", help="start with the draft model alone (/online later)")
    generation = parser.add_argument_group("generation")
    generation.add_argument("--mode", choices=["hybrid", "rounds"], default="hybrid",
                            help="hybrid: the service streams and verifies the drafter's guesses as they arrive "
                                 "(default); rounds: draft a block, wait for its verdict, repeat")
    add_k_argument(generation)
    add_sampling_arguments(generation)
    generation.add_argument("--system", help="system prompt (default: the resumed chat's, or the template's)")
    generation.add_argument("--max-tokens", type=int, default=1024, help="longest reply, in tokens")
    generation.add_argument("--context", type=int, default=4096,
                            help="context of the draft model; the oldest turns are left out beyond it")
    chats = parser.add_argument_group("saved chats ($XDG_DATA_HOME/specwire/chats)")
    chats.add_argument("--resume", nargs="?", const=LATEST, metavar="ID",
                       help="continue a saved chat (default: the latest)")
    chats.add_argument("--list", action="store_true", help="list the saved chats and exit")
    # not given: the config file's [chat] table decides, then the usual default (app/chat/chat_config.py)
    parser.set_defaults(k=FROM_CONFIG, temperature=FROM_CONFIG)
