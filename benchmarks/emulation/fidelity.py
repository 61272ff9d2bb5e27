"""Does the replay reproduce the real pair? Acceptance by guess position, real against emulated.

    .venv/bin/python -m benchmarks.emulation.fidelity [--k 4] [--max-tokens 96] [--kinds code,chat,prose,repeat]
        [--json FILE]

The same prompts (the recording's: the default prompt set), greedy, at 0 ms, in the streaming
mode with the drafter always guessing (at most `--k` guesses a pass, as `specwire bench`'s
`stream-k4`), twice:

  real      `specwire serve` on the default pair (llama.cpp, this CPU) and the real 0.5B drafter;
  emulated  the emulated service (a100-qwen2.5-1.5b, replaying the recording) and the emulated
            drafter (laptop-gpu-0.5b, guessing from the recording).

Printed: for each guess position in a pass, how many guesses there were and how many of them
the target kept, for both, and the difference in points. Which positions begin a pass depends
on timing, which differs between the two by design (a GPU against this CPU); what a guess at a
position is, given the text before it, does not, and that is what the replay must reproduce.
Every reply is checked against the recorded target path.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.emulation.drafter import EmulatedDraft
from benchmarks.emulation.profiles import load_drafter_profile
from benchmarks.emulation.recording import DEFAULT_RECORDING, Recording
from benchmarks.emulation.serve import start_emulated_service
from benchmarks.readme_flow import start

TARGET_PROFILE, DRAFTER_PROFILE = "a100-qwen2.5-1.5b", "laptop-gpu-0.5b"


def start_real_service() -> tuple[subprocess.Popen, str]:
    """`specwire serve` on the default pair, as the README starts it."""
    return start([sys.executable, "-m", "app.cli", "serve", "--port", "0", "--exit-with-parent"])


def by_position(url: str, draft, entries: list, k: int, max_tokens: int) -> dict:
    """Guesses and kept guesses by position in a pass, over every entry; and replies off the path."""
    from local_draft.stream_speculator import StreamSpeculator
    from local_draft.verify_client import VerifyClient
    from wire.protocol import SamplingParams

    params = SamplingParams()
    drafted: list[int] = []
    accepted: list[int] = []
    differing = 0
    client = VerifyClient(url, draft.hello(params, client="benchmarks.emulation.fidelity"), stall_timeout_s=120.0)
    try:
        for entry in entries:
            generator = StreamSpeculator(draft, client, params, max_block=k, colocated=False)
            result = generator.generate(entry.prompt, max_tokens)
            stats = result.stats
            for totals, counts in ((drafted, stats.drafted_per_position), (accepted, stats.accepted_per_position)):
                totals.extend([0] * (len(counts) - len(totals)))
                for i, n in enumerate(counts):
                    totals[i] += n
            differing += result.token_ids != entry.path[:max_tokens]
            print(f"  {entry.kind:<7} {entry.text[:40]!r}: {sum(stats.drafted_per_position)} guessed, "
                  f"{sum(stats.accepted_per_position)} kept", file=sys.stderr, flush=True)
    finally:
        client.close()
    return {"drafted": drafted, "accepted": accepted, "differing": differing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=4, help="at most this many guesses a pass (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--kinds", default="code,chat,prose,repeat")
    parser.add_argument("--recording", type=Path, default=DEFAULT_RECORDING)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from local_draft.draft_model import DraftModel
    from models.registry import file_path, get_pair

    recording = Recording.load(args.recording)
    entries = [entry for entry in recording.entries if entry.kind in args.kinds.split(",")]
    pair = get_pair()
    draft_path = file_path(pair, pair.draft)
    runs = {}

    service, url = start_real_service()
    try:
        print("# real: specwire serve (default pair, this CPU) and the 0.5B drafter", file=sys.stderr)
        runs["real"] = by_position(url, DraftModel(draft_path), entries, args.k, args.max_tokens)
    finally:
        service.terminate()
        service.wait(timeout=60)

    service, url = start_emulated_service(TARGET_PROFILE, "--replay", str(args.recording), "--vocab", str(draft_path))
    try:
        print(f"# emulated: {TARGET_PROFILE} (replay) and {DRAFTER_PROFILE}", file=sys.stderr)
        drafter = EmulatedDraft(DraftModel(draft_path, vocab_only=True), load_drafter_profile(DRAFTER_PROFILE),
                                recording)
        runs["emulated"] = by_position(url, drafter, entries, args.k, args.max_tokens)
    finally:
        service.terminate()
        service.wait(timeout=60)

    print(f"\nacceptance by guess position, streaming with up to {args.k} guesses a pass, greedy, 0 ms, "
          f"{len(entries)} prompts x {args.max_tokens} tokens")
    print(f"| position | real guesses | real kept | emulated guesses ({TARGET_PROFILE} + {DRAFTER_PROFILE}) "
          "| emulated kept | difference |")
    print("|---|---|---|---|---|---|")
    rows = []
    real, emulated = runs["real"], runs["emulated"]
    for i in range(max(len(real["drafted"]), len(emulated["drafted"]))):
        cells = []
        for run in (real, emulated):
            n = run["drafted"][i] if i < len(run["drafted"]) else 0
            kept = run["accepted"][i] if i < len(run["accepted"]) else 0
            cells.append((n, kept / n if n else None))
        (n_real, a_real), (n_emulated, a_emulated) = cells
        difference = 100 * (a_emulated - a_real) if a_real is not None and a_emulated is not None else None
        rows.append({"position": i + 1, "real_guesses": n_real, "real_kept": a_real, "emulated_guesses": n_emulated,
                     "emulated_kept": a_emulated, "difference_points": difference})
        show = lambda a: "-" if a is None else f"{a:.3f}"  # noqa: E731
        print(f"| {i + 1} | {n_real} | {show(a_real)} | {n_emulated} | {show(a_emulated)} | "
              f"{'-' if difference is None else f'{difference:+.1f}'} |")
    print(f"replies off the target's path: real {real['differing']}, emulated {emulated['differing']}")
    if args.json:
        args.json.write_text(json.dumps({"emulated": f"{TARGET_PROFILE} + {DRAFTER_PROFILE}", "k": args.k,
                                         "max_tokens": args.max_tokens, "rows": rows, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
