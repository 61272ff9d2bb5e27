"""The `specwire` command: argument parsing and dispatch to one function per subcommand."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from app import commands
from app.chat.arguments import add_chat_arguments, k_setting
from app.serve_command import add_service_arguments


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="specwire", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    models = sub.add_parser("models", help="build or manage model files")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    tiny = models_sub.add_parser("tiny", help="build the tiny test models (a target and two drafters)")
    tiny.add_argument("dir", help="output folder")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(run=commands.models_tiny)
    fetch = models_sub.add_parser("fetch", help="download and assemble a model pair into the cache")
    fetch.add_argument("pair", nargs="?", help="pair name (default: the default pair)")
    fetch.set_defaults(run=commands.models_fetch)
    listing = models_sub.add_parser("list", help="show every model pair, whether it is here, and where")
    listing.set_defaults(run=commands.models_list)
    export_onnx = models_sub.add_parser("export-onnx", help="export a target to ONNX for `serve --backend onnx`")
    export_onnx.add_argument("target", help="a Hugging Face model folder or a GGUF file")
    export_onnx.add_argument("out", help="output folder (new, empty, or an earlier export to replace)")
    export_onnx.set_defaults(run=commands.models_export_onnx)

    serve = sub.add_parser("serve", help="run the verification service")
    serve.add_argument("--target", help="target model: a GGUF file or a Hugging Face folder "
                       "(default: the target of --pair)")
    serve.add_argument("--pair", default=env("SPECWIRE_PAIR"), help="model pair (default: the default pair)")
    serve.add_argument("--backend", default=env("SPECWIRE_BACKEND", "auto"), choices=["auto", "torch", "llamacpp", "onnx"],
                       help="target engine; auto: torch when CUDA is available, llama.cpp otherwise")
    serve.add_argument("--device", default=env("SPECWIRE_DEVICE", "auto"), choices=["auto", "cpu", "cuda"])
    serve.add_argument("--host", default=env("SPECWIRE_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(env("SPECWIRE_PORT", "8765")), help="0 picks a free port")
    serve.add_argument("--token-file", default=env("SPECWIRE_TOKEN_FILE"),
                       help="file holding the bearer token clients must send")
    serve.add_argument("--max-draft", type=int, default=32, help="longest draft block per round (default: %(default)s)")
    serve.add_argument("--max-context", type=int, default=4096,
                       help="longest history per session (default: %(default)s)")
    serve.add_argument("--exit-with-parent", action="store_true",
                       help="stop when standard input closes (the program that started the service exited)")
    add_service_arguments(serve)
    serve.set_defaults(run=commands.serve)

    demo = sub.add_parser("demo", help="run the whole pipeline on this machine, target alone vs speculation")
    demo.add_argument("--k", type=int, default=4)
    demo.add_argument("--max-tokens", type=int, default=64)
    demo.add_argument("--tiny", action="store_true", help="tiny random models instead of the default pair")
    demo.set_defaults(run=commands.demo)

    gen = sub.add_parser("generate", help="generate a continuation of one prompt")
    gen.add_argument("--draft", help="draft model GGUF file (default: the draft of --pair)")
    gen.add_argument("--pair", default=env("SPECWIRE_PAIR"), help="model pair (default: the default pair)")
    where = gen.add_mutually_exclusive_group()
    where.add_argument("--server", default=env("SPECWIRE_SERVER", "ws://127.0.0.1:8765"),
                       help="ws://HOST:PORT of a verification service (default: %(default)s)")
    where.add_argument("--offline", action="store_true", help="draft model alone, no verification "
                       "(the same as --mode offline)")
    gen.add_argument("--mode", choices=["hybrid", "server", "offline"], default="hybrid",
                     help="hybrid: draft here, verify there (default); server: the service generates alone "
                          "and streams (no draft model runs); offline: the draft model alone")
    gen.add_argument("--token-file", default=env("SPECWIRE_TOKEN_FILE"))
    gen.add_argument("--ca-file", default=env("SPECWIRE_CA_FILE"),
                     help="CA certificates to trust for a wss:// service (default: the system's)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0 keeps every token")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--k", type=k_setting, default="auto",
                     help="draft tokens per round: a number (0: the service makes every token) or auto "
                          "(chosen each round from measured acceptance and costs; default)")
    gen.add_argument("--no-pipeline", dest="pipeline", action="store_false",
                     help="do not draft the next block while a verdict is in flight")
    gen.add_argument("--draft-gpu-layers", type=int, default=-1,
                     help="layers of the draft model on the GPU (-1: all, 0: none)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, token ids and stats")
    gen.set_defaults(run=commands.generate)

    proxy = sub.add_parser("proxy", help="relay a service with added round-trip time and jitter (for testing)")
    proxy.add_argument("--upstream", default=env("SPECWIRE_SERVER", "ws://127.0.0.1:8765"),
                       help="the service to relay to (default: %(default)s)")
    proxy.add_argument("--rtt-ms", type=float, default=50.0, help="round-trip time to add (default: 50)")
    proxy.add_argument("--jitter-ms", type=float, default=0.0, help="+- spread of that time (default: 0)")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    proxy.set_defaults(run=commands.proxy)

    from app.bench.command import add_arguments as add_bench_arguments

    bench = sub.add_parser("bench", help="every mode side by side under emulated round-trip times: "
                           "tokens/s, target passes, round trips and bytes per token (table, JSON, plot)")
    add_bench_arguments(bench)
    bench.set_defaults(run=commands.bench)

    chat = sub.add_parser("chat", help="chat in the terminal: hybrid (default), remote (--server) or --offline")
    add_chat_arguments(chat)
    chat.set_defaults(run=commands.chat)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.run(args) or 0
    except commands.UserError as exc:
        print(f"specwire: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
