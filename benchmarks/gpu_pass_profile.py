"""Where a pass's time goes on the static torch path, on a CUDA GPU: the graph replay against the
whole forward, and the kernels by time (torch.profiler).

    python -m benchmarks.gpu_pass_profile [--model 7b] [--context 512]

Random weights of the named Qwen2.5 shape (benchmarks/gpu.py), bfloat16, CUDA graphs on. Prints,
for a pass of one token of 1 and of 32 sessions: forward_many's milliseconds and the captured
graph's replay alone (CUDA events); then the profiler's tables for ten one-session passes (by GPU
time and by host time) and for five of the same forward run without graphs (each kernel by name).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu import CONFIGS, build_model
from remote_verify.backends.target import Pass
from remote_verify.backends.torch_static import StaticEngine

SESSIONS = 32


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="7b", choices=sorted(CONFIGS))
    parser.add_argument("--context", type=int, default=512, help="tokens cached per session")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("torch sees no CUDA device: this profiles the graphed GPU path")
    model = build_model(args.model, torch.device("cuda"), torch.bfloat16)
    vocab = model.config.vocab_size
    engine = StaticEngine(model, slots=SESSIONS + 1, context=args.context + 64)
    rng = np.random.default_rng(0)
    caches = [engine.new_cache() for _ in range(SESSIONS)]
    for cache in caches:
        engine.forward_many([Pass(cache, rng.integers(0, vocab, args.context).tolist(), 1, argmax_only=True)])

    def one_token(n: int) -> None:
        engine.forward_many([Pass(cache, [5], 1, argmax_only=True) for cache in caches[:n]])
        for cache in caches[:n]:
            engine.truncate(cache, args.context)

    for n in (1, SESSIONS):
        for _ in range(5):
            one_token(n)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(30):
            one_token(n)
        whole = (time.perf_counter() - started) / 30 * 1000
        entry = next(e for (rows, width, _), e in engine.graphs.captured.items() if rows == n and width == 1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(5):
            entry.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(30):
            entry.replay()
        end.record()
        torch.cuda.synchronize()
        print(f"{args.model} {n} sessions x 1 token, {args.context} cached: forward_many {whole:.2f} ms, "
              f"graph replay alone {start.elapsed_time(end) / 30:.2f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as graphed:
        for _ in range(10):
            one_token(1)
    print(graphed.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
    print(graphed.key_averages().table(sort_by="cpu_time_total", row_limit=18, max_name_column_width=60))
    plain = StaticEngine(model, slots=1, context=args.context + 64, cuda_graphs=False)
    cache = plain.new_cache()
    plain.forward_many([Pass(cache, rng.integers(0, vocab, args.context).tolist(), 1, argmax_only=True)])
    with profile(activities=[ProfilerActivity.CUDA]) as eager:
        for _ in range(5):
            plain.forward_many([Pass(cache, [5], 1, argmax_only=True)])
            plain.truncate(cache, args.context)
    print(eager.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
