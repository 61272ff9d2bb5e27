"""`specwire proxy`: relay a verification service with added round-trip time and jitter."""

from __future__ import annotations

import argparse
import asyncio
import os

from app.user_error import UserError


def register(sub: argparse._SubParsersAction) -> None:
    proxy = sub.add_parser("proxy", help="relay a service with added round-trip time and jitter (for testing)")
    proxy.add_argument("--upstream", default=os.environ.get("SPECWIRE_SERVER", "ws://127.0.0.1:8765"),
                       help="the service to relay to (default: %(default)s)")
    proxy.add_argument("--rtt-ms", type=float, default=50.0, help="round-trip time to add (default: 50)")
    proxy.add_argument("--jitter-ms", type=float, default=0.0, help="+- spread of that time (default: 0)")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    proxy.set_defaults(run=run_proxy)


def run_proxy(args: argparse.Namespace) -> int:
    from app.latency_proxy import LatencyProxy

    try:
        relay = LatencyProxy(args.upstream, rtt_ms=args.rtt_ms, jitter_ms=args.jitter_ms, host=args.host,
                             port=args.port)
    except ValueError as exc:
        raise UserError(str(exc)) from exc

    async def run() -> None:
        await relay.start()
        print(f"relaying {relay.url} -> {relay.upstream_host}:{relay.upstream_port} with {args.rtt_ms:g} ms "
              f"round trip (jitter {args.jitter_ms:g} ms)", flush=True)
        await relay.serve_forever_started()

    try:
        asyncio.run(run())
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    return 0
