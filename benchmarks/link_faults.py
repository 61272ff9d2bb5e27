"""The default mode against `--mode server` on a link with jitter and random drops, side by side.

    python -m benchmarks.link_faults [--minutes 6] [--tokens 96] [--rtt-ms 40] [--jitter-ms 20]
                                     [--disconnect-every 30] [--seed 1] [--tiny] [--json FILE]

One `specwire serve` (the default pair's target, or the tiny one with --tiny) behind one
`specwire proxy`-style link (app/latency_proxy.py): --rtt-ms with +- --jitter-ms, and every
connection cut at a random time, --disconnect-every seconds after it opened on average (seeded).
Two users, one per mode, each on a link of its own that it keeps between replies as the CLI's
chat does: the default mode (the drafter guesses ahead of the stream; a lost session waits
TAKEOVER_WAIT_S for a new one, then goes on offline) and `--mode server` (the target streams
alone, a lost stream resumes on a new connection). They take turns prompt by prompt (the order
swapped every round), greedy, until --minutes are up. Printed: each mode's tokens/s (its
tokens over its own wall time), the ratio, reconnects, offline tokens, and whether the two
modes' replies were the same.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.latency_proxy import LatencyProxy
from app.link_faults import LinkFaults
from benchmarks.replica_pool import SPECWIRE
from benchmarks.session_wave import PROMPTS
from local_draft.draft_model import DraftModel
from local_draft.server_only import ServerOnlyGenerator
from local_draft.service_link import TAKEOVER_WAIT_S, ServiceLink
from local_draft.stream_speculator import StreamSpeculator
from wire.protocol import SamplingParams


def models(tiny: bool) -> tuple[Path, Path]:
    """(draft GGUF, target) of the default pair, or of the tiny models."""
    if tiny:
        from models.tiny import build_tiny_models

        built = build_tiny_models(Path(tempfile.mkdtemp(prefix="specwire-link-")), seed=0)
        return built.draft, built.target_gguf
    from app.model_paths import resolve_model

    return Path(resolve_model(None, None, "draft")), Path(resolve_model(None, None, "target"))


def start_service(target: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([SPECWIRE, "serve", "--target", str(target), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"the service did not start: {line!r}")
    return process, line.split()[-1]


class Mode:
    def __init__(self, name: str, url: str, draft: DraftModel):
        self.name = name
        self.link = ServiceLink(url, draft.hello(SamplingParams(), client=f"link-faults ({name})"),
                                takeover_wait_s=TAKEOVER_WAIT_S)
        if name == "default":
            self.generator = StreamSpeculator(draft, self.link, SamplingParams())
        else:
            self.generator = ServerOnlyGenerator(self.link, draft.end_ids, resume_within_s=30.0)
        self.tokens = 0
        self.wall_s = 0.0
        self.offline = 0
        self.replies: list[list[int]] = []

    def reply(self, prompt: list[int], max_tokens: int) -> None:
        offline = [0]

        def on_commit(tokens: list[int], provenance: list[str]) -> None:
            offline[0] += provenance.count("offline")

        began = time.perf_counter()
        result = self.generator.generate(prompt, max_tokens, on_commit)
        self.wall_s += time.perf_counter() - began
        self.tokens += len(result.token_ids)
        self.offline += offline[0]
        self.replies.append(result.token_ids)

    def summary(self) -> dict:
        return {"tokens": self.tokens, "wall_s": round(self.wall_s, 1),
                "tokens_per_s": round(self.tokens / self.wall_s, 2) if self.wall_s else 0.0,
                "reconnects": self.link.connections - 1, "offline_tokens": self.offline,
                "replies": len(self.replies)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.link_faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rtt-ms", type=float, default=40.0)
    parser.add_argument("--jitter-ms", type=float, default=20.0)
    parser.add_argument("--disconnect-every", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="the tiny models instead of the default pair")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    args = parser.parse_args(argv)
    draft_path, target = models(args.tiny)
    service, url = start_service(target)
    faults = LinkFaults(rtt_ms=args.rtt_ms, jitter_ms=args.jitter_ms, disconnect_every_s=args.disconnect_every)
    proxy = LatencyProxy(url, seed=args.seed, faults=faults)
    proxy.start_in_thread()
    draft = DraftModel(draft_path)
    prompts = [draft.tokenize(text) for text in PROMPTS]
    modes = [Mode("default", proxy.url, draft), Mode("server", proxy.url, draft)]
    deadline = time.monotonic() + args.minutes * 60
    rounds = 0
    try:
        while time.monotonic() < deadline:
            prompt = prompts[rounds % len(prompts)]
            for mode in modes if rounds % 2 == 0 else modes[::-1]:
                mode.reply(prompt, args.tokens)
            rounds += 1
    finally:
        for mode in modes:
            mode.link.close()
        proxy.stop()
        service.kill()
    default, server = (mode.summary() for mode in modes)
    same = sum(a == b for a, b in zip(modes[0].replies, modes[1].replies))
    report = {"config": {"minutes": args.minutes, "tokens": args.tokens, "rtt_ms": args.rtt_ms,
                         "jitter_ms": args.jitter_ms, "disconnect_every_s": args.disconnect_every, "seed": args.seed,
                         "models": "tiny" if args.tiny else "default pair", "takeover_wait_s": TAKEOVER_WAIT_S},
              "default": default, "server": server,
              "default_over_server": round(default["tokens_per_s"] / server["tokens_per_s"], 3),
              "proxy_drops": proxy.drops, "same_replies": f"{same} of {rounds}"}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
