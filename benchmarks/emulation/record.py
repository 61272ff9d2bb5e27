"""Record the default pair's decisions for the emulator (benchmarks/emulation/recording.py).

    .venv/bin/python -m benchmarks.emulation.record [--tokens 256] [--out FILE] [--draft GGUF] [--target GGUF]
        [--temperature T --seed S [--top-k K] [--top-p P]]
    .venv/bin/python -m benchmarks.emulation.record --top-only [--out FILE] [--draft GGUF]

Starts a real verification service on the target (llama.cpp, as `specwire serve` runs it:
batch-invariant kernels, so its path is the one every mode commits), streams each
prompt's continuation from it (`--mode server`), then evaluates the draft model token
by token along that path and keeps its guess at every position, and its TOP_CHOICES likeliest
tokens with their probabilities (what a tree's branches take). Greedy by default: the argmax,
and the candidates by probability. With `--temperature` the service samples under `--seed` (the
race over that seed's clocks at each position, as every mode decides), and the drafter's guess
is its race's winner over the same clocks, its candidates in the race's order
(`recordings/default-pair-t0.7.json`: `--temperature 0.7 --seed 1 --tokens 128`). `--top-only` adds those to a
recording made before them, with the drafter alone (the target's path is already recorded). About
five minutes for the
default prompt set at 256 tokens on two quiet CPU cores. Each prompt is saved as soon as it is
recorded, and a run picks up where an interrupted one stopped (the prompts already in --out).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
from pathlib import Path

from app.bench.prompts import PROMPTS
from app.demo import start_service
from benchmarks.emulation.recording import DEFAULT_RECORDING, Recorded, Recording

log = logging.getLogger(__name__)

TOP_CHOICES = 8  # as many as the drafter gives a tree's node (local_draft/draft_model.py BRANCH_CHOICES)


def drafter_top(draft, context: list[int], params=None, seed: int | None = None) -> list[list]:
    """The drafter's TOP_CHOICES candidates after `context`, [token, probability] best first: by
    probability (greedy), or in the order of the race over `seed`'s clocks at that position."""
    from wire.protocol import SamplingParams
    from wire.randomness import DecisionRandomness

    params = params or SamplingParams()
    randomness = None if params.greedy else DecisionRandomness(seed)
    clocks_for = (lambda position: None) if randomness is None else (
        lambda position: randomness.race(position, draft.vocab_size))
    options = draft.branch_guesses(context, [()], params, clocks_for)[0]
    return [[token, round(p, 4)] for token, p in options[:TOP_CHOICES]]


def guess_first(top: list[list], guess: int) -> list[list]:
    """`top` with the recorded guess first: a chain's guess there and a tree's first choice must be
    the same token, or the two shapes would be replayed from different drafters."""
    if top and top[0][0] != guess:
        kept = [each for each in top if each[0] == guess]
        return (kept or [[guess, top[0][1]]]) + [each for each in top if each[0] != guess][:len(top) - 1]
    return top


def record_top(recording: Recording, draft_path: Path) -> Recording:
    """Add the drafter's top guesses at every position of each recorded path, with the drafter alone."""
    from local_draft.draft_model import DraftModel

    draft = DraftModel(draft_path, n_ctx=4096)
    for entry in recording.entries:
        entry.top = [drafter_top(draft, entry.prompt + entry.path[:i], recording.params, recording.seed)
                     for i in range(len(entry.path))]
        changed = sum(top[0][0] != guess for top, guess in zip(entry.top, entry.guesses))
        if changed:
            log.warning("%r: the drafter's argmax differs from the recorded guess at %d positions (near-ties "
                        "that this evaluation breaks the other way): the recorded guess is put first there",
                        entry.text[:30], changed)
            entry.top = [guess_first(top, guess) for top, guess in zip(entry.top, entry.guesses)]
        log.info("%s %r: top %d recorded at %d positions", entry.kind, entry.text[:30], TOP_CHOICES, len(entry.top))
    recording.about["top"] = f"{draft_path.name}, top {TOP_CHOICES}, {datetime.date.today().isoformat()}"
    return recording


def record(draft_path: Path, target_path: Path, max_tokens: int, out: Path | None = None,
           params=None, seed: int | None = None) -> Recording:
    """Record every prompt of the default set (those not already in `out`, which is rewritten after each);
    greedy, or sampled with `params` under `seed`."""
    from local_draft.draft_model import DraftModel
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.verify_client import VerifyClient
    from wire.protocol import SamplingParams

    params = params or SamplingParams()
    if not params.greedy and seed is None:
        raise ValueError("a sampled recording needs a seed: its text is that seed's, and its users ask with it")
    draft = DraftModel(draft_path, n_ctx=4096)
    earlier = Recording.load(out) if out is not None and out.is_file() else None  # picked up where it stopped
    if earlier is not None and earlier.params_problem(params):
        raise ValueError(f"{out} holds a recording made with other sampling: {earlier.params_problem(params)}")
    entries = earlier.entries if earlier is not None else []
    done = {entry.text for entry in entries}
    about = {"draft": draft_path.name, "target": target_path.name, "max_tokens": max_tokens,
             "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {platform.processor()}",
             "service": "specwire serve (llama.cpp, batch-invariant), --mode server"}
    if not params.greedy:
        about["sampling"] = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                             "seed": seed}
    service, url = start_service(target_path, "--max-context", "4096")
    try:
        # a long prompt's pass on a busy machine may take a while: a stall is a minute of silence
        client = VerifyClient(url, draft.hello(params, seed=seed, client="benchmarks.emulation.record"),
                              stall_timeout_s=60.0)
        streamed = ServerOnlyGenerator(client, draft.end_ids)
        for kind, texts in PROMPTS.items():
            for text in texts:
                if text in done:
                    continue
                prompt = draft.tokenize(text)
                result = streamed.generate(prompt, max_tokens)
                path = result.token_ids
                top = [drafter_top(draft, prompt + path[:i], params, seed) for i in range(len(path))]
                guesses = [options[0][0] for options in top]
                right = sum(g == t for g, t in zip(guesses, path))
                log.info("%s %r: %d tokens (%s), the drafter's guess right at %d of them",
                         kind, text[:30], len(path), result.stop_reason, right)
                entries.append(Recorded(kind, text, prompt, path, guesses, result.stop_reason, top))
                if out is not None:
                    Recording(entries, about).save(out)
        client.close()
    finally:
        service.terminate()
        service.wait(timeout=60)
    order = [text for texts in PROMPTS.values() for text in texts]
    return Recording(sorted(entries, key=lambda entry: order.index(entry.text)), about)


def main() -> None:
    from models.registry import file_path, get_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="tokens recorded per prompt (fewer at an end token)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RECORDING)
    parser.add_argument("--draft", type=Path, help="draft GGUF (default: the default pair's)")
    parser.add_argument("--target", type=Path, help="target GGUF (default: the default pair's)")
    parser.add_argument("--top-only", action="store_true", help="add the drafter's top guesses to the recording "
                        "at --out (no target needed)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else sampled under --seed")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, help="with --temperature: the seed every user of the replay asks with")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pair = get_pair()
    draft = args.draft or file_path(pair, pair.draft)
    if args.top_only:
        recording = record_top(Recording.load(args.out), Path(draft))
        recording.save(args.out)
        print(f"added the drafter's top {TOP_CHOICES} to {len(recording.entries)} prompts in {args.out}")
        return
    from wire.protocol import SamplingParams

    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    problems = params.problems()
    if problems:
        parser.error("; ".join(problems))
    if not params.greedy and args.seed is None:
        parser.error("--temperature needs --seed: a sampled recording's text is its seed's")
    target = args.target or file_path(pair, pair.target)
    recording = record(Path(draft), Path(target), args.tokens, args.out, params, args.seed)
    recording.save(args.out)
    print(f"wrote {len(recording.entries)} prompts to {args.out}")


if __name__ == "__main__":
    main()
