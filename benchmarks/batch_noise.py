"""How much a target backend's logits move with the batch shape, and what invariance costs.

    .venv/bin/python -m benchmarks.batch_noise [--backend llamacpp|torch] [--target PATH] [--block 5]
    .venv/bin/python -m benchmarks.batch_noise --cost [--rounds 3] [--threads N]

Greedy parity compares a block verified in one forward pass with the same tokens decoded
one at a time. An engine whose kernels depend on the batch shape scores a position
differently in the two, and a near-tie can flip. The first form decodes the default prompt
set's code prompts plus 64 generated tokens both ways, with the backend's batch-invariant
mode on and off, and prints per mode the positions whose logits are bit-identical and the
largest and median absolute difference.

`--cost` (llama.cpp) times one verify pass of 1, 5 and 9 tokens (k = 0, 4, 8) after a
100-token prompt, rolled back after each pass as a rejection would be, with the
batch-invariant kernels and with llama.cpp's fast ones. Each measurement runs in a process
of its own (llama.cpp reads its tiled-product switch once per process), the two modes
alternating round after round so that both see the same machine; medians in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

from app.bench.prompts import PROMPTS

BLOCKS = (1, 5, 9)  # k + 1 for k = 0, 4, 8
MODES = {"invariant": True, "fast": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch"])
    parser.add_argument("--target", help="target model (default: the default pair's)")
    parser.add_argument("--block", type=int, default=5, help="tokens per verify pass (k + 1)")
    parser.add_argument("--cost", action="store_true", help="time verify passes in both modes (llama.cpp)")
    parser.add_argument("--rounds", type=int, default=3, help="--cost: processes per mode")
    parser.add_argument("--reps", type=int, default=7, help="--cost: passes per block size and process")
    parser.add_argument("--threads", type=int, help="--cost: llama.cpp threads (default: the backend's)")
    parser.add_argument("--time-one", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    target = args.target or default_target()
    if args.time_one:
        print(json.dumps(time_passes(target, MODES[args.time_one], args.reps, args.threads)))
    elif args.cost:
        print_cost(args, target)
    else:
        for mode, invariant in MODES.items():
            print_noise(args.backend, target, args.block, mode, invariant)


def default_target() -> str:
    from models.registry import get_pair, require_file

    pair = get_pair()
    return str(require_file(pair, pair.target))


def print_noise(backend_name: str, target: str, block: int, mode: str, invariant: bool) -> None:
    from local_draft.draft_model import DraftModel
    from models.registry import get_pair, require_file
    from remote_verify.backends.factory import load_backend

    pair = get_pair()
    backend = load_backend(backend_name, target, device="cpu", batch_invariant=invariant)
    draft = DraftModel(require_file(pair, pair.draft), n_threads=1)
    differences, exact = [], 0
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
        for start in range(prompt_len - 1, len(tokens), block):
            chunk = tokens[start:start + block]
            blocked.extend(backend.forward(cache, chunk, len(chunk)))
        gaps = np.abs(np.stack(single) - np.stack(blocked)).max(axis=-1)
        differences.extend(gaps)
        exact += int((gaps == 0).sum())
    print(f"{backend_name} ({mode}): logits, one at a time vs blocks of {block}, {len(differences)} positions: "
          f"{exact} bit-identical, max {max(differences):.4f}, median {np.median(differences):.4f}")


def time_passes(target: str, invariant: bool, reps: int, threads: int | None) -> dict[int, float]:
    """Median ms of one verify pass per block size, in this process."""
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget

    backend = LlamaCppTarget(target, gpu_layers=0, n_threads=threads, batch_invariant=invariant)
    cache = backend.new_cache()
    prompt = list(range(1000, 1100))
    backend.forward(cache, prompt, 1)
    times: dict[int, list[float]] = {block: [] for block in BLOCKS}
    for _ in range(reps):
        for block in BLOCKS:  # interleaved, so that a burst of load falls on every size
            start = time.perf_counter()
            backend.forward(cache, list(range(2000, 2000 + block)), block)
            times[block].append((time.perf_counter() - start) * 1000)
            backend.truncate(cache, len(prompt))
    return {block: statistics.median(values) for block, values in times.items()}


def print_cost(args: argparse.Namespace, target: str) -> None:
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            command = [sys.executable, "-m", "benchmarks.batch_noise", "--time-one", mode,
                       "--target", target, "--reps", str(args.reps)]
            if args.threads:
                command += ["--threads", str(args.threads)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[mode].append({int(block): ms for block, ms in json.loads(out.splitlines()[-1]).items()})
    medians = {mode: {block: statistics.median(run[block] for run in runs[mode]) for block in BLOCKS}
               for mode in MODES}
    print(f"verify pass, ms (median of {args.rounds} processes x {args.reps} passes), 100-token prompt")
    print(f"{'kernels':10s}" + "".join(f"{f'k={block - 1}':>10s}" for block in BLOCKS))
    for mode in MODES:
        print(f"{mode:10s}" + "".join(f"{medians[mode][block]:10.1f}" for block in BLOCKS))
    print(f"{'cost':10s}" + "".join(f"{medians['invariant'][b] / medians['fast'][b] - 1:+10.0%}" for b in BLOCKS))


if __name__ == "__main__":
    main()
