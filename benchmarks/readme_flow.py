"""The README's own flow, measured: `specwire serve` alone, `specwire generate` per prompt and mode.

    .venv/bin/python -m benchmarks.readme_flow [--rtt-ms 0,20,50,100] [--modes server,k0,rounds,default]
        [--kinds code,chat,prose,repeat] [--prompts-per-kind N] [--untuned] [--max-tokens 96]
        [--temperature T [--seed S]] [--json FILE]

What a user runs, nothing pinned and no flags picked: the service is `specwire serve` on the
default pair, started as the README says (alone, it takes every core); each generation is a
`specwire generate --json` process of its own, through `specwire proxy --rtt-ms R` for a
round trip R > 0. The modes, interleaved prompt by prompt (and their order rotated):
  server   `--mode server`: the service streams alone (the baseline: what any remote model API gives)
  k0       `--mode rounds --k 0`: one round trip a token
  rounds   `--mode rounds`: draft a block, wait for its verdict (the default before streaming)
  default  no flags: the service streams, the drafter guesses ahead while that pays
  server-again  `--mode server` once more: the noise floor (its ratio to server, with no difference at all)
The adaptive controllers learn as a user's would: from a fresh state file at the start of the
run, kept between the runs (`SPECWIRE_ADAPTIVE_STATE`). Each reply's tokens/s and first token
are the ones `generate` measures (from the request to the end of the reply: loading the drafter
is left out, for every mode alike); the target's busy time per token is the service's own time
in that reply's passes. Every reply is compared with server-only's.
`--temperature T` samples every generation (`generate --temperature T --seed S`, S 1 unless `--seed`
says otherwise): the text is the seed's, the same in every mode, so replies are still compared with
server-only's. `--untuned` runs 8 prompts written for this check only (4 code, 2 chat, 2 prose) instead of
the default set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app.bench.prompts import PROMPTS, chat

MODES = {"server": ["--mode", "server"], "k0": ["--mode", "rounds", "--k", "0"], "rounds": ["--mode", "rounds"],
         "default": [],
         # the baseline run a second time, interleaved like the others: its ratio to "server" is
         # the machine's noise, the spread any other mode's ratio shows with no difference at all
         "server-again": ["--mode", "server"]}
UNTUNED = {
    "code": ["def binary_search(items, target):", "fn parse_line(line: &str) -> Option<(String, u32)> {",
             "SELECT customer_id, SUM(amount) AS total\nFROM orders\n",
             "async function fetchJson(url) {"],
    "chat": [chat("Explain what a mutex is and when to use one."), chat("How do I reverse a linked list in C?")],
    "prose": ["The best way to learn a new language is", "In the winter of 1816, the weather in Europe"],
}


@dataclass
class Reply:
    mode: str
    rtt_ms: float
    kind: str
    index: int
    tokens: int
    wall_s: float
    first_token_s: float
    busy_s: float  # the service's time in this reply's passes
    passes: int
    drafted: int
    accepted: int
    token_ids: list[int]


def start(command: list[str]) -> tuple[subprocess.Popen, str]:
    """A specwire process that prints its URL first ("listening on ..." or the proxy's)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    words = [w for w in line.split() if w.startswith("ws://")]
    if not words:
        process.kill()
        raise RuntimeError(f"{' '.join(command[:4])} did not start: {line!r}")
    return process, words[0]


def generate(url: str, mode: str, text: str, max_tokens: int, env: dict, sampling: tuple[str, ...] = ()) -> dict:
    done = subprocess.run([sys.executable, "-m", "app.cli", "generate", "--server", url, "--prompt", text,
                           "--max-tokens", str(max_tokens), "--json", *MODES[mode], *sampling],
                          capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"generate ({mode}) failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def run(rtts_ms: list[float], modes: list[str], prompts: list[tuple[str, int, str]], max_tokens: int,
        state_file: Path, sampling: tuple[str, ...] = ()) -> list[Reply]:
    env = dict(os.environ, SPECWIRE_ADAPTIVE_STATE=str(state_file))
    service, url = start([sys.executable, "-m", "app.cli", "serve", "--port", "0", "--exit-with-parent"])
    proxies = {}
    replies = []
    try:
        for rtt in rtts_ms:
            if rtt > 0:
                process, proxy_url = start([sys.executable, "-m", "app.cli", "proxy", "--upstream", url,
                                            "--rtt-ms", str(rtt), "--port", "0"])
                proxies[rtt] = (process, proxy_url)
        for turn, (kind, index, text) in enumerate(prompts):
            for rtt in rtts_ms:
                link = proxies[rtt][1] if rtt > 0 else url
                shift = turn % len(modes)
                for mode in modes[shift:] + modes[:shift]:
                    out = generate(link, mode, text, max_tokens, env, sampling)
                    stats = out["stats"]
                    reply = Reply(mode, rtt, kind, index, stats["generated"], stats["wall_s"],
                                  stats["first_token_s"] or stats["wall_s"], stats["service_s"],
                                  stats["verified_rounds"], stats["drafted"], stats["accepted"], out["token_ids"])
                    replies.append(reply)
                    print(f"  {kind} {index} {rtt:g} ms {mode:8s} {reply.tokens / reply.wall_s:6.1f} tok/s, first token "
                          f"{reply.first_token_s:.2f} s, {reply.drafted} drafted / {reply.accepted} accepted",
                          file=sys.stderr, flush=True)
    finally:
        for process, _ in proxies.values():
            process.terminate()
        service.terminate()
        service.wait(timeout=60)
    return replies


def table(replies: list[Reply], rtts_ms: list[float], modes: list[str]) -> str:
    kinds = sorted({r.kind for r in replies}, key=[r.kind for r in replies].index) + ["all"]
    server_tokens = {(r.kind, r.index): r.token_ids for r in replies if r.mode == "server"}
    control = "server-again" in modes
    lines = ["| kind | RTT | " + " | ".join(f"{m} tok/s" for m in modes)
             + " | default/server | first token default/server | busy per token default/server | same as server |"
             + (" server again/server (noise) |" if control else ""),
             "|" + "---|" * (len(modes) + 6 + control)]
    for kind in kinds:
        for rtt in rtts_ms:
            cell = {m: [r for r in replies if r.mode == m and r.rtt_ms == rtt and kind in (r.kind, "all")]
                    for m in modes}
            rate = {m: sum(r.tokens for r in rs) / max(sum(r.wall_s for r in rs), 1e-9) for m, rs in cell.items()}
            first = {m: sum(r.first_token_s for r in rs) / max(len(rs), 1) for m, rs in cell.items()}
            busy = {m: sum(r.busy_s for r in rs) / max(sum(r.tokens for r in rs), 1) for m, rs in cell.items()}
            same = [r.token_ids == server_tokens.get((r.kind, r.index)) for m in modes if m != "server"
                    for r in cell[m]]
            ratio = lambda d: f"{d['default'] / d['server']:.2f}x" if "default" in d and d.get("server") else "-"  # noqa: E731
            lines.append(f"| {kind} | {rtt:g} ms | " + " | ".join(f"{rate[m]:.1f}" for m in modes)
                         + f" | {ratio(rate)} | {ratio(first)} | {ratio(busy)} | {sum(same)} of {len(same)} |"
                         + (f" {rate['server-again'] / rate['server']:.2f}x |" if control and rate.get("server") else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtt-ms", default="0,20,50,100")
    parser.add_argument("--modes", default="server,k0,rounds,default")
    parser.add_argument("--kinds", default=",".join(PROMPTS))
    parser.add_argument("--prompts-per-kind", type=int)
    parser.add_argument("--untuned", action="store_true", help="8 prompts written for this check, not the default set")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0, help="sample at T (default 0: greedy)")
    parser.add_argument("--seed", type=int, default=1, help="with --temperature: every generation's seed")
    parser.add_argument("--json", type=Path, metavar="FILE")
    args = parser.parse_args()
    sampling = ("--temperature", str(args.temperature), "--seed", str(args.seed)) if args.temperature > 0 else ()
    source = UNTUNED if args.untuned else PROMPTS
    kinds = [k for k in args.kinds.split(",") if k in source]
    chosen = {kind: source[kind][: args.prompts_per_kind] for kind in kinds}
    longest = max(len(texts) for texts in chosen.values())
    prompts = [(kind, i, chosen[kind][i]) for i in range(longest) for kind in kinds if i < len(chosen[kind])]
    modes = args.modes.split(",")
    rtts = [float(r) for r in args.rtt_ms.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        started = time.time()
        replies = run(rtts, modes, prompts, args.max_tokens, Path(folder) / "adaptive-k.json", sampling)
    print(f"README flow (specwire serve + specwire generate, default pair, nothing pinned), {args.max_tokens} tokens, "
          f"{f'T {args.temperature:g}, seed {args.seed}' if sampling else 'greedy'}, {len(prompts)} prompts, {time.time() - started:.0f} s")
    print(table(replies, rtts, modes))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in replies]) + "\n")


if __name__ == "__main__":
    main()
