"""The `specwire` command: one subcommand per module, each declaring its own flags beside what it does.

Each command module keeps heavy imports (torch, transformers, llama.cpp) inside the
function that runs it, so building the parser loads none of them.
"""

from __future__ import annotations

import argparse
import logging
import sys

from app import demo, generate_command, models_command, proxy_command, serve_command
from app.api import command as api_command
from app.bench import command as bench_command
from app.chat import arguments as chat_command
from app.user_error import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specwire", description="Lossless speculative decoding: a draft model here, the target model's "
                                     "verification service there, and the target's output exactly.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (models_command, serve_command, demo, generate_command, proxy_command, bench_command,
                    chat_command, api_command):
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.run(args) or 0
    except UserError as exc:
        print(f"specwire: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
