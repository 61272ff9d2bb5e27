"""`specwire api`: its flags, and the endpoint started on uvicorn once the models and the service are ready.

The port is bound first (a port in use is said at once, before minutes of loading), the
engine starts (drafters, the embedded service or a --server), then uvicorn serves on that
socket and "listening on http://HOST:PORT/v1" is printed on stdout.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path

from app.api.settings import DEFAULT_MODEL_NAME, DEFAULT_PORT, ApiSettings
from app.chat.settings import ChatSettings
from app.generation_flags import add_k_argument, add_mix_argument, drafting
from app.threads_flags import add_draft_threads_argument
from app.token_file import read_token_file
from app.user_error import UserError


def register(sub: argparse._SubParsersAction) -> None:
    api = sub.add_parser("api", help="an OpenAI-compatible endpoint on this machine (editors, aider, llm, "
                                     "Open WebUI, the openai package) that speculates against the service")
    add_api_arguments(api)
    api.set_defaults(run=api_command)


def add_api_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    endpoint = parser.add_argument_group("endpoint")
    endpoint.add_argument("--host", default=env("SPECWIRE_API_HOST", "127.0.0.1"),
                          help="address to listen on (default: %(default)s, this machine only)")
    endpoint.add_argument("--port", type=int, default=int(env("SPECWIRE_API_PORT", DEFAULT_PORT)),
                          help="port to listen on, 0 for a free one (default: %(default)s)")
    endpoint.add_argument("--api-token-file", default=env("SPECWIRE_API_TOKEN_FILE"),
                          help="file holding the bearer token clients must send (their API key); needed to "
                               "listen beyond this machine")
    endpoint.add_argument("--insecure-no-auth", action="store_true",
                          help="allow a non-loopback --host without --api-token-file (another layer must "
                               "authenticate)")
    endpoint.add_argument("--model-name", default=DEFAULT_MODEL_NAME,
                          help="the model name clients send and GET /v1/models lists (default: %(default)s)")
    endpoint.add_argument("--drafters", type=int, default=1,
                          help="draft models to load: each serves one request at a time; a request that finds "
                               "none free drafts by copying its context (n-gram) (default: %(default)s)")
    models = parser.add_argument_group("models (default: the default pair, verified by an embedded service)")
    models.add_argument("--draft", help="draft model GGUF file (default: the draft of --pair), or `ngram`: draft "
                        "by copying the context, with no model (no offline mode)")
    models.add_argument("--tokenizer", help="with --draft ngram: the GGUF whose vocabulary tokenizes (default: "
                        "a --server's own, else the draft of --pair)")
    add_mix_argument(models)
    models.add_argument("--target", help="target of the embedded service: a GGUF file or a Hugging Face folder")
    models.add_argument("--pair", default=env("SPECWIRE_PAIR"), help="model pair (default: the default pair)")
    models.add_argument("--backend", default=env("SPECWIRE_BACKEND", "auto"), choices=["auto", "torch", "llamacpp"],
                        help="the embedded service's engine (as for serve)")
    models.add_argument("--draft-gpu-layers", type=int, default=-1,
                        help="layers of the draft model on the GPU (-1: all, 0: none)")
    add_draft_threads_argument(models)
    models.add_argument("--context", type=int, default=4096,
                        help="context of the draft model (the service's limit applies too): prompt and reply")
    service = parser.add_argument_group("service")
    service.add_argument("--server", default=env("SPECWIRE_SERVER"),
                         help="ws://HOST:PORT (or wss://) of a remote verification service instead of the embedded one")
    service.add_argument("--token-file", default=env("SPECWIRE_TOKEN_FILE"), help="bearer token for --server")
    service.add_argument("--ca-file", default=env("SPECWIRE_CA_FILE"), help="CA certificates for a wss:// --server")
    service.add_argument("--offline", action="store_true",
                         help="the draft model alone, no service: every token is unverified (and marked so)")
    add_k_argument(parser.add_argument_group("generation (sampling is each request's own)"))


def api_command(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    listener = bind(settings.host, settings.port)  # before the models load: a port in use is said at once
    from app.api.engine import ApiEngine  # the models' modules load only for the endpoint itself
    from app.api.server import serve

    engine = ApiEngine(settings, progress=lambda text: print(f"[{text}]", file=sys.stderr, flush=True))
    try:
        engine.start()
        serve(engine, settings, listener)
    finally:
        engine.close()
        listener.close()
    return 0


def settings_from(args: argparse.Namespace) -> ApiSettings:
    from app.chat.launch import embedded_target
    from app.model_paths import resolve_model
    from app.tokenizer_source import tokenizer_path

    problems = [f"--context must be 64 or more, got {args.context}"] if args.context < 64 else []
    problems += [f"--drafters must be 0 or more, got {args.drafters}"] if args.drafters < 0 else []
    problems += [f"--port must be 0 to 65535, got {args.port}"] if not 0 <= args.port <= 65535 else []
    if problems:
        raise UserError("; ".join(problems))
    api_token = read_token_file(args.api_token_file)
    if api_token is None and not args.insecure_no_auth and not is_loopback(args.host):
        raise UserError(f"--host {args.host} lets other machines in: give --api-token-file (the token clients "
                        "must send), or --insecure-no-auth if another layer authenticates")
    how = drafting(args)
    token = read_token_file(args.token_file)
    if how == "ngram":
        if args.offline:
            raise UserError("--draft ngram has no local model to generate with: it cannot run --offline")
        draft = tokenizer_path(args.tokenizer, args.pair, args.server, token, args.ca_file)
        if not draft.is_file():
            raise UserError(f"there is no tokenizer GGUF at {draft} (--tokenizer)")
    else:
        draft = Path(resolve_model(args.draft, args.pair, "draft"))
        if not draft.is_file():
            raise UserError(f"there is no draft model at {draft} (--draft)")
        if args.drafters == 0:
            raise UserError("--drafters 0 loads no draft model: use --draft ngram to draft without one")
    target, target_problem = (None, None) if args.offline else embedded_target(args)
    models = ChatSettings(draft=draft, drafting=how, target=target, target_problem=target_problem, pair=args.pair,
                          backend=args.backend, server=args.server, token=token, ca_file=args.ca_file,
                          offline=args.offline, k=args.k, context=args.context,
                          draft_gpu_layers=args.draft_gpu_layers, draft_threads=args.draft_threads)
    return ApiSettings(models=models, host=args.host, port=args.port, api_token=api_token,
                       model_name=args.model_name, drafters=0 if how == "ngram" else args.drafters)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def bind(host: str, port: int) -> socket.socket:
    """The listening socket's address, bound now (listening starts when the engine is ready)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror} (another program has the port? "
                        "choose one with --port)") from exc
    return sock
