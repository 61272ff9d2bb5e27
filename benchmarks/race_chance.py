"""How likely a sampled tree's branch is to be the target's pick: the drafter's probability or the race's chance.

    .venv/bin/python -m benchmarks.race_chance [--recording FILE] [--spreads 0.3,0.5,0.84,1.2,2] [--json FILE]

Sampled, both ends race the same clocks (wire/sampling.py `race_choice`), so a tree's candidates
come in the race's order, and the tree grows where its first choice is unlikely to be the target's
(local_draft/draft_tree.py). This reads a sampled recording (the target's path under its seed;
default: the default pair's at T 0.7), evaluates the draft model along it token by token at the
recording's sampling, and for its candidates at every position (`race_candidates`) compares two estimates
of each being the target's token: the drafter's probability (renormalised over the candidates), and
the race's chance (local_draft/draft_model.py `RACE_SPREAD`: a candidate arriving at t, its clock
over its probability, weighs t ** -(T / spread)) at each spread given. It prints each estimate's
log-likelihood of the target's actual tokens (higher is better) and, bucketed by the estimate of
the first choice, how often the first choice was right: a calibrated estimate reads the same.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.emulation.recording import SAMPLED_RECORDING, Recording
from local_draft.draft_model import RACE_SPREAD, race_candidates, race_chance
from wire.randomness import DecisionRandomness

BUCKETS = [(0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.95), (0.95, 1.01)]


def positions(recording: Recording, draft) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Per position of every path: the candidates' probabilities and race arrivals, in the race's
    order, and the index of the target's token among them (-1: none of them)."""
    params, randomness = recording.params, DecisionRandomness(recording.seed)
    out = []
    for entry in recording.entries:
        for i, token in enumerate(entry.path):
            context = entry.prompt + entry.path[:i]
            draft.keep_up(context)
            ids, probs, arrival = race_candidates(draft._last_logits(), params,
                                                  randomness.race(len(context), draft.vocab_size))
            hit = np.flatnonzero(ids == token)
            out.append((probs, arrival, int(hit[0]) if hit.size else -1))
    return out


def by_probability(probs: np.ndarray, arrival: np.ndarray, temperature: float) -> np.ndarray:
    return probs / probs.sum()


def by_race(spread: float):
    return lambda probs, arrival, temperature: race_chance(arrival, temperature, spread)


def score(rows, estimate, temperature: float) -> dict:
    log_likelihood, buckets = 0.0, {bucket: [0, 0] for bucket in BUCKETS}
    for probs, arrival, hit in rows:
        chance = estimate(probs, arrival, temperature)
        log_likelihood += np.log(max(chance[hit], 1e-12)) if hit >= 0 else np.log(1e-3)  # 1e-3: none caught it
        for low, high in BUCKETS:
            if low <= chance[0] < high:
                buckets[(low, high)][0] += 1
                buckets[(low, high)][1] += hit == 0
    return {"log_likelihood": round(log_likelihood, 1),
            "first_right_by_chance": {f"{low:g}-{min(high, 1):g}": (n, round(right / n, 2) if n else None)
                                      for (low, high), (n, right) in buckets.items()}}


def main() -> None:
    from local_draft.draft_model import DraftModel
    from models.registry import file_path, get_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recording", type=Path, default=SAMPLED_RECORDING)
    parser.add_argument("--spreads", default=f"0.3,0.5,{RACE_SPREAD:g},1.2,2")
    parser.add_argument("--draft", type=Path, help="draft GGUF (default: the default pair's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    recording = Recording.load(args.recording)
    if recording.params.greedy:
        raise SystemExit(f"{args.recording} is greedy: the race's chance is for a sampled recording")
    pair = get_pair()
    draft = DraftModel(args.draft or file_path(pair, pair.draft), n_ctx=4096)
    rows = positions(recording, draft)
    temperature = recording.params.temperature
    results = {"drafter's probability": score(rows, by_probability, temperature)}
    for spread in (float(s) for s in args.spreads.split(",")):
        results[f"race, spread {spread:g}"] = score(rows, by_race(spread), temperature)
    print(f"{len(rows)} positions of {args.recording.name} (T {temperature:g}, seed {recording.seed}); the target's "
          f"token among the candidates at {sum(hit >= 0 for *_, hit in rows)}, first at {sum(hit == 0 for *_, hit in rows)}")
    print("| estimate | log-likelihood | first choice right, by its estimate: " + " | ".join(
        f"{low:g}-{min(high, 1):g}" for low, high in BUCKETS) + " |")
    print("|---|---|" + "---|" * len(BUCKETS))
    for name, result in results.items():
        cells = " | ".join(f"{right} ({n})" if n else "-" for n, right in result["first_right_by_chance"].values())
        print(f"| {name} | {result['log_likelihood']} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
