"""How much a target backend's logits move with the batch shape alone.

    .venv/bin/python -m benchmarks.batch_noise --backend llamacpp [--target PATH] [--block 5]

Greedy parity compares a block verified in one forward pass with the same tokens decoded
one at a time. An engine whose kernels depend on the batch shape can score a position
differently in the two, and a near-tie can flip. This script decodes the default prompt
set's code prompts plus 64 generated tokens both ways and prints the largest and median
absolute logit difference per position: the margin a divergence must fall under to count
as a near-tie (tests/models/test_default_pair.py states the one it uses).
"""

from __future__ import annotations

import argparse

import numpy as np

from app.bench.prompts import PROMPTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch"])
    parser.add_argument("--target", help="target model (default: the default pair's)")
    parser.add_argument("--block", type=int, default=5, help="tokens per verify pass (k + 1)")
    args = parser.parse_args()
    from local_draft.draft_model import DraftModel
    from models.registry import get_pair, require_file
    from remote_verify.backends import load_backend

    pair = get_pair()
    backend = load_backend(args.backend, args.target or require_file(pair, pair.target), device="cpu")
    draft = DraftModel(require_file(pair, pair.draft))
    differences = []
    for prompt in PROMPTS["code"]:
        tokens = draft.tokenize(prompt)
        cache = backend.new_cache()
        single = [backend.forward(cache, tokens, 1)[0]]
        for _ in range(64):  # greedy continuation, one token at a time
            token = int(single[-1].argmax())
            tokens.append(token)
            single.append(backend.forward(cache, [token], 1)[0])
        prompt_len = len(tokens) - 64
        cache = backend.new_cache()
        backend.forward(cache, tokens[:prompt_len - 1], 1)
        blocked = []
        for start in range(prompt_len - 1, len(tokens), args.block):
            chunk = tokens[start:start + args.block]
            blocked.extend(backend.forward(cache, chunk, len(chunk)))
        differences.extend(np.abs(np.stack(single) - np.stack(blocked)).max(axis=-1))
    print(f"{args.backend}: logits, one at a time vs blocks of {args.block}, over {len(differences)} positions: "
          f"max {max(differences):.4f}, median {np.median(differences):.4f}")


if __name__ == "__main__":
    main()
