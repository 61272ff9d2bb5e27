"""Default-pair numbers for docs/results.md: acceptance by prompt kind, service memory, time to ready.

    .venv/bin/python -m benchmarks.default_pair [--backends llamacpp,torch] [--ks 4,8] [--cold]

For each backend it starts `specwire serve` as a child process, times it from launch to
its "listening on" line (with --cold, the torch backend's converted-weights cache is
deleted first, so the GGUF is de-quantized again) and reads the service's peak resident
memory (VmHWM) before stopping it. On the first backend it also runs every prompt of the
default set greedily for 128 tokens at each k: greedy acceptance depends only on the two
models' choices, so it is the same on every backend. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time

from app.bench.prompts import PROMPTS


def start_service(backend: str) -> tuple[subprocess.Popen, str, float]:
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--backend", backend, "--port", "0", "--exit-with-parent"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # the service ends with us, however we end
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise SystemExit(f"the {backend} service did not start")
    return process, line.split()[-1], time.perf_counter() - started


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def acceptance_by_kind(url: str, k: int, max_tokens: int,
                       prompts: dict[str, list[str]] = PROMPTS) -> dict[str, tuple[float, float]]:
    from local_draft.draft_model import DraftModel
    from local_draft.speculator import Speculator
    from local_draft.verify_client import VerifyClient
    from models.registry import get_pair, require_file
    from wire.protocol import SamplingParams

    pair = get_pair()
    draft = DraftModel(require_file(pair, pair.draft))
    hello = draft.hello(SamplingParams(), client="benchmark")
    client = VerifyClient(url, hello)
    results = {}
    for kind, texts in prompts.items():
        accepted = drafted = generated = rounds = 0
        for prompt in texts:
            stats = Speculator(draft, client, SamplingParams(), k=k).generate(draft.tokenize(prompt), max_tokens).stats
            accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
            generated, rounds = generated + stats.generated, rounds + stats.rounds
        results[kind] = (accepted / drafted, generated / rounds)
    client.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="llamacpp,torch")
    parser.add_argument("--ks", default="4,8")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--cold", action="store_true", help="delete the converted torch weights first")
    args = parser.parse_args()
    from models.registry import models_dir

    ks = [int(k) for k in args.ks.split(",") if k]  # --ks "" measures the services only
    rows, service_rows = [], []
    for index, backend in enumerate(args.backends.split(",")):
        if args.cold and backend == "torch":
            shutil.rmtree(models_dir() / "converted", ignore_errors=True)
        process, url, ready_s = start_service(backend)
        try:
            for k in ks if index == 0 else []:
                for kind, (rate, per_round) in acceptance_by_kind(url, k, args.max_tokens).items():
                    rows.append(f"| {kind} | {k} | {rate:.2f} | {per_round:.2f} |")
            # every service serves a few rounds before its memory is read: weights are
            # memory-mapped, so an idle service has not paged them in yet
            acceptance_by_kind(url, 4, 32, {"warm-up": PROMPTS["code"][:1]})
            service_rows.append(f"| {backend} | {ready_s:.1f} s{' (cold)' if args.cold and backend == 'torch' else ''} | "
                                f"{peak_rss_mb(process.pid):,.0f} MiB |")
        finally:
            process.terminate()
            process.wait(timeout=60)
    print("| prompt kind | k | acceptance rate | tokens per round |\n|---|---|---|---|")
    print("\n".join(rows))
    print("\n| backend | time to ready | peak memory (VmHWM) |\n|---|---|---|")
    print("\n".join(service_rows))


if __name__ == "__main__":
    main()
