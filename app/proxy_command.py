"""`specwire proxy`: relay a verification service through a link with the faults users' links have."""

from __future__ import annotations

import argparse
import asyncio
import os

from app.user_error import UserError


def register(sub: argparse._SubParsersAction) -> None:
    proxy = sub.add_parser("proxy", help="relay a service through a link with added round-trip time, jitter, "
                           "stalls, drops and a bandwidth cap (for testing)")
    proxy.add_argument("--upstream", default=os.environ.get("SPECWIRE_SERVER", "ws://127.0.0.1:8765"),
                       help="the service to relay to (default: %(default)s)")
    proxy.add_argument("--rtt-ms", type=float, default=50.0, help="round-trip time to add (default: 50)")
    proxy.add_argument("--jitter-ms", type=float, default=0.0, help="+- spread of that time (default: 0)")
    proxy.add_argument("--stall-every", type=float, default=0.0, metavar="SECONDS",
                       help="stall each connection at random times, this far apart on average (default: 0, never)")
    proxy.add_argument("--stall-s", type=float, default=0.0, metavar="SECONDS",
                       help="how long a stall holds every byte, both ways, without closing the connection")
    proxy.add_argument("--disconnect-every", type=float, default=0.0, metavar="SECONDS",
                       help="cut each connection at a random time, this long after it opened on average "
                       "(default: 0, never)")
    proxy.add_argument("--bandwidth-kbps", type=float, default=0.0, metavar="KBIT_PER_S",
                       help="cap each direction of each connection (default: 0, no cap)")
    proxy.add_argument("--seed", type=int, default=None,
                       help="seed of the jitter, stall and drop times: the same seed, the same faults")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    proxy.set_defaults(run=run_proxy)


def run_proxy(args: argparse.Namespace) -> int:
    from app.latency_proxy import LatencyProxy
    from app.link_faults import LinkFaults

    faults = LinkFaults(rtt_ms=args.rtt_ms, jitter_ms=args.jitter_ms, stall_every_s=args.stall_every,
                        stall_s=args.stall_s, disconnect_every_s=args.disconnect_every,
                        bandwidth_kbps=args.bandwidth_kbps)
    try:
        relay = LatencyProxy(args.upstream, host=args.host, port=args.port, seed=args.seed, faults=faults)
    except ValueError as exc:
        raise UserError(str(exc)) from exc

    async def run() -> None:
        await relay.start()
        print(f"relaying {relay.url} -> {relay.upstream_host}:{relay.upstream_port} with {faults.describe()}",
              flush=True)
        await relay.serve_forever_started()

    try:
        asyncio.run(run())
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    return 0
