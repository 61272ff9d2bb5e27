"""CPU a sampled token costs at the default pair's vocabulary: the warp and the race, per pick.

    .venv/bin/python -m benchmarks.sampling_cost [--repeats 200] [--json FILE]

Every sampled token is warped (wire/sampling.py `warp`: temperature, top-k, top-p) and raced over
its position's clocks (`race_choice`), on the service for each pick of a pass and on the drafter for
each guess. At 151,936 tokens that is host work beside a GPU's step of 10 to 20 ms, once per token
per session: a service sampling for 32 users pays it 32 times a pass. This times, side by side in
one process, `warp` as it is and the definition computed by a sort of the whole vocabulary
(`sorted_warp`, the tests' reference: what `warp` did whenever top-k was off, as it is by default;
with a top-k it already selected the k first), for the usual settings, on two kinds of logits
(synthetic: `flat`, a normal with scale 3, the worst case for top-p, which then keeps thousands;
`peaked`, a few tokens far ahead, as a model mostly is), and the clocks and the race alone.
Report the ratio; an absolute time on this shared machine says little.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from wire.protocol import SamplingParams
from wire.randomness import DecisionRandomness
from wire.sampling import race_choice, warp

VOCAB = 151_936  # the default pair's
SETTINGS = {"T 0.7": SamplingParams(temperature=0.7), "T 0.7, top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
            "T 0.7, top-k 40": SamplingParams(temperature=0.7, top_k=40),
            "T 1, top-k 40, top-p 0.95": SamplingParams(temperature=1.0, top_k=40, top_p=0.95)}


def sorted_warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """warp's definition by a sort of the whole vocabulary: descending logits, equal ones in ascending
    id, cut at top-k, then at the shortest prefix whose mass reaches top-p, renormalised."""
    scaled = logits.astype(np.float64) / params.temperature
    order = np.lexsort((np.arange(scaled.size), -scaled))
    if 0 < params.top_k < scaled.size:
        order = order[:params.top_k]
    mass = np.exp(scaled[order] - scaled[order[0]])
    mass /= mass.sum()
    if params.top_p < 1.0:
        n_keep = int(np.searchsorted(np.cumsum(mass), params.top_p, side="left")) + 1
        order, mass = order[:n_keep], mass[:n_keep] / mass[:n_keep].sum()
    probs = np.zeros(scaled.size)
    probs[order] = mass
    return probs


def logits_kinds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    flat = (rng.normal(size=VOCAB) * 3.0).astype(np.float32)
    peaked = rng.normal(size=VOCAB).astype(np.float32)
    peaked[rng.integers(VOCAB, size=4)] += 14.0
    return {"flat": flat, "peaked": peaked}


def per_call_ms(work, repeats: int) -> float:
    began = time.process_time()
    for _ in range(repeats):
        work()
    return (time.process_time() - began) / repeats * 1000


def measure(repeats: int) -> list[dict]:
    rows = []
    for kind, logits in logits_kinds().items():
        for name, params in SETTINGS.items():
            now = per_call_ms(lambda: warp(logits, params), repeats)
            before = per_call_ms(lambda: sorted_warp(logits, params), max(repeats // 10, 3))
            kept = int(np.count_nonzero(warp(logits, params)))
            rows.append({"logits": kind, "sampling": name, "warp_ms": round(now, 3), "sorted_ms": round(before, 3),
                         "x": round(before / now, 1), "kept": kept})
    randomness = DecisionRandomness(1)
    probs = warp(logits_kinds()["flat"], SETTINGS["T 0.7"])
    clocks = randomness.race(100, VOCAB)
    rows.append({"logits": "-", "sampling": "clocks of one position", "warp_ms": round(
        per_call_ms(lambda: randomness.race(100, VOCAB), repeats), 3), "sorted_ms": None, "x": None, "kept": None})
    rows.append({"logits": "flat", "sampling": "race over the kept set", "warp_ms": round(
        per_call_ms(lambda: race_choice(probs, clocks), repeats), 3), "sorted_ms": None, "x": None, "kept": None})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = measure(args.repeats)
    print(f"CPU ms a call at a vocabulary of {VOCAB:,} (process time)")
    print("| logits | sampling | warp ms | by a whole sort ms | x | tokens kept |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['logits']} | {row['sampling']} | {row['warp_ms']} | {row['sorted_ms'] or '-'} | "
              f"{row['x'] or '-'} | {row['kept'] or '-'} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
