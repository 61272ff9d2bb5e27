"""The real verification service on an emulated device, in a process of its own.

    .venv/bin/python -m benchmarks.emulation.serve --profile a100-qwen2.5-1.5b [--replay FILE | --target GGUF]
        [--time-scale F] [--port 0] [--max-sessions 64] [--batch-tokens N] [--max-context N] [--exit-with-parent]
        [--trace-passes FILE]

Prints "listening on ws://..." once sessions are taken, as `specwire serve` does. The
service (remote_verify/server.py) is the product's; its target is `EmulatedTarget`
(benchmarks/emulation/target.py): the default pair's recorded decisions (`--replay`,
the default) or a real tiny target (`--target`), each pass held for the profile's time. Kept
out of `specwire serve` on purpose: emulation is a measuring instrument, not a way to run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
from pathlib import Path

from benchmarks.emulation.profiles import load_target_profile
from benchmarks.emulation.recording import DEFAULT_RECORDING, Recording
from benchmarks.emulation.target import EmulatedTarget, ReplayTarget
from wire.limits import BATCH_TOKENS, FIRST_TOKEN_ROOM, FIRST_TOKEN_ROOM_MS, ServiceLimits


def emulated_backend(profile: str, replay: Path | None, target: Path | None, time_scale: float,
                     max_context: int, vocab: Path | None = None):
    """The EmulatedTarget these settings describe."""
    if target is not None:
        from remote_verify.backends.llamacpp_backend import LlamaCppTarget

        inner = LlamaCppTarget(target, max_context=max_context, gpu_layers=0, n_threads=1)
    else:
        from models.registry import file_path, get_pair

        pair = get_pair()
        inner = ReplayTarget(Recording.load(replay or DEFAULT_RECORDING), vocab or file_path(pair, pair.draft),
                             max_context=max_context)
    return EmulatedTarget(inner, load_target_profile(profile), time_scale)


def main() -> None:
    from remote_verify.server import ServiceConfig, VerifyService
    from remote_verify.session import SessionLimits

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, help="a target profile (benchmarks/emulation/profiles)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--replay", type=Path, help=f"a recording (default: {DEFAULT_RECORDING.name})")
    source.add_argument("--target", type=Path, help="a real (tiny) target GGUF instead of the replay")
    parser.add_argument("--vocab", type=Path, help="with --replay: the GGUF whose vocabulary the recording's "
                        "tokens are in (default: the default pair's draft)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="every emulated duration times this")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-sessions", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--max-draft", type=int, default=32)
    parser.add_argument("--exit-with-parent", action="store_true")
    parser.add_argument("--fair-passes", action=argparse.BooleanOptionalAction, default=True,
                        help="guesses fill a shared pass only as every member's ledger allows (specwire serve "
                        "--fair-passes, its default)")
    parser.add_argument("--first-token-room", type=float, default=FIRST_TOKEN_ROOM,
                        help="specwire serve --first-token-room (default: %(default)s)")
    parser.add_argument("--first-token-room-ms", type=float, default=FIRST_TOKEN_ROOM_MS,
                        help="specwire serve --first-token-room-ms, in the emulated device's ms (default: %(default)s)")
    parser.add_argument("--trace-passes", type=Path, metavar="FILE", help="specwire serve --trace-passes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.exit_with_parent:
        from app.exit_with_parent import exit_with_parent

        exit_with_parent()
    backend = emulated_backend(args.profile, args.replay, args.target, args.time_scale, args.max_context, args.vocab)
    config = ServiceConfig(port=args.port, limits=SessionLimits(max_draft=args.max_draft, max_context=args.max_context),
                           service_limits=ServiceLimits(max_sessions=args.max_sessions),
                           batch_tokens=args.batch_tokens, first_token_room=args.first_token_room,
                           # the service's clock runs --time-scale times the device's: so does a bound in time
                           first_token_room_ms=args.first_token_room_ms * args.time_scale,
                           trace_passes=args.trace_passes)
    service = VerifyService(backend, config)
    service.queue.fair = args.fair_passes
    from prometheus_client import Gauge

    Gauge("specwire_emulated_overrun_seconds", "time by which emulated passes outlasted their profile's",
          registry=service.metrics.registry).set_function(lambda: backend.overrun_s)
    asyncio.run(service.run(lambda url: print(f"listening on {url}", flush=True)))


def start_emulated_service(profile: str, *options: str) -> tuple[subprocess.Popen, str]:
    """Start this module as a child process; returns it and its URL (it ends with us)."""
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.emulation.serve", "--profile", profile,
                                "--exit-with-parent", *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"the emulated service did not start: {line!r}")
    return process, line.split()[-1]


if __name__ == "__main__":
    main()
