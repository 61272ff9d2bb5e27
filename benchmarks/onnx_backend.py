"""The ONNX backend's numbers: export time and size, and verify latency beside the torch backend.

    .venv/bin/python -m benchmarks.onnx_backend [--tiny] [--target PATH] [--onnx DIR] [--export]
                                                [--k 1 4 8] [--context 256] [--repeats 10] [--threads N]

Export: `models.onnx_export.export_onnx(target, DIR, check=...)` timed, when --export is given or DIR
holds no export yet; the folder's size is printed either way. The default target is the
default pair's (a GGUF file, de-quantized once into the cache as the torch backend does);
--tiny builds the tiny test models and uses their target.

Verify latency: each backend runs in its own process on the CPU (the ONNX one from DIR,
torch from the target); both stay loaded for the whole run. Each fills one cache with
--context prompt tokens; then every repeat runs, for each k and for each backend in turn,
one verification pass as a session does (k + 1 new tokens, k + 1 rows of logits) and rolls
it back. Interleaving keeps both backends under the same machine load; the table gives the
median per backend and k, and their ratio. --threads N gives each backend N CPU threads
(torch.set_num_threads, onnxruntime's intra-op pool) instead of each runtime's default: on
a machine shared with other work, torch's OpenMP threads wait for each other far longer
than onnxruntime's. Resident memory is read in each worker after loading and after the
prefill (torch maps its weights and reads them on first use).

Agreement: both backends score every position of the default prompt set
(`app/bench/prompts.py`) from an empty cache; the largest and median |logit difference|
and how often their argmax agrees.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the tiny test target instead of the default pair's")
    parser.add_argument("--target", help="target model (default: the default pair's)")
    parser.add_argument("--onnx", help="export folder (default: a temporary one, exported now)")
    parser.add_argument("--export", action="store_true", help="export again even if --onnx holds an export")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 8], help="draft lengths to time")
    parser.add_argument("--context", type=int, default=256, help="prompt tokens in the cache before timing")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, help="CPU threads per backend (default: each runtime's own)")
    args = parser.parse_args()

    from models.onnx_export import export_onnx
    from remote_verify.backends.onnx_check import logit_difference
    from models.onnx_manifest import is_onnx_export

    scratch = tempfile.TemporaryDirectory(prefix="specwire-onnx-bench-")
    target = Path(args.target) if args.target else _default_target(args.tiny, Path(scratch.name))
    out = Path(args.onnx) if args.onnx else Path(scratch.name) / "onnx"
    if args.export or not is_onnx_export(out):
        result = export_onnx(target, out, check=logit_difference, progress=lambda line: print(f"  {line}", flush=True))
        print(f"export: {result.seconds:.1f} s (de-quantizing a GGUF included when it was not cached yet)")
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"export size: {size / 1e6:,.1f} MB in {out}")

    workers = {"torch": _Worker("torch", target, args.threads), "onnx": _Worker("onnx", out, args.threads)}
    try:
        for name, worker in workers.items():
            load_s, resident, vocab = worker.ask("load")
            print(f"{name}: loaded in {load_s:.1f} s (resident memory {resident:,.0f} MiB)")
        _latency_table(workers, vocab, args.k, args.context, args.repeats)
        _agreement(workers, out)
    finally:
        for worker in workers.values():
            worker.close()
        scratch.cleanup()


def _default_target(tiny: bool, scratch: Path) -> Path:
    if tiny:
        from models.tiny import build_tiny_models

        return build_tiny_models(scratch / "tiny").target
    from models.registry import get_pair, require_file

    pair = get_pair()
    return require_file(pair, pair.target)


def _latency_table(workers: dict, vocab: int, ks: list[int], context: int, repeats: int) -> None:
    prompt = [(7919 * i + 13) % vocab for i in range(context)]  # latency does not depend on the ids
    for name, worker in workers.items():
        seconds, resident = worker.ask("prefill", prompt)
        print(f"{name}: prefill of {context} tokens in {seconds:.2f} s, resident memory then {resident:,.0f} MiB")
    times: dict[tuple[str, int], list[float]] = {(name, k): [] for name in workers for k in ks}
    for repeat in range(repeats + 1):  # the first round warms up and is not counted
        for k in ks:
            block = [(prompt[-1] + 31 * j + repeat) % vocab for j in range(k + 1)]
            for name, worker in workers.items():
                elapsed = worker.ask("verify", block, context)
                if repeat:
                    times[name, k].append(elapsed)
    print(f"\nverify latency, median of {repeats}, context {context} tokens, one pass of k + 1 tokens:")
    print("| k | " + " | ".join(f"{name} (ms)" for name in workers) + " | onnx / torch |")
    print("|---|" + "---|" * (len(workers) + 1))
    for k in ks:
        medians = {name: statistics.median(times[name, k]) * 1000 for name in workers}
        ratio = medians["onnx"] / medians["torch"]
        print(f"| {k} | " + " | ".join(f"{medians[name]:.1f}" for name in workers) + f" | {ratio:.2f} |")


def _agreement(workers: dict, export: Path) -> None:
    """Logits of both backends at every position of the default prompts: how far apart, same argmax?"""
    import numpy as np
    from tokenizers import Tokenizer

    from app.bench.prompts import PROMPTS

    tokenizer = Tokenizer.from_file(str(export / "tokenizer.json"))
    differences, positions, same_argmax = [], 0, 0
    for prompt in [p for kind in PROMPTS.values() for p in kind]:
        ids = tokenizer.encode(prompt).ids
        torch_logits, onnx_logits = workers["torch"].ask("logits", ids), workers["onnx"].ask("logits", ids)
        differences.extend(np.abs(torch_logits - onnx_logits).max(axis=-1))  # per position
        positions += len(ids)
        same_argmax += int((torch_logits.argmax(-1) == onnx_logits.argmax(-1)).sum())
    print(f"\nlogits, onnx vs torch, at all {positions} positions of the default prompts: max |difference| "
          f"{max(differences):.2e}, median {np.median(differences):.2e}; same argmax at {same_argmax}/{positions}")


class _Worker:
    """One backend in its own process, so that two runtimes' thread pools never share one.

    In one process, torch's OpenMP threads (which keep spinning after each operator) and
    onnxruntime's pool slowed each other down several times over.
    """

    def __init__(self, kind: str, path: Path, threads: int | None):
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_serve_backend, args=(kind, str(path), threads, child), daemon=True)
        self.process.start()

    def ask(self, *request):
        self.pipe.send(request)
        return self.pipe.recv()

    def close(self) -> None:
        if self.process.is_alive():
            self.pipe.send(("stop",))
        self.process.join(30)


def _serve_backend(kind: str, path: str, threads: int | None, pipe) -> None:
    """A worker's loop: load the backend, then run and time the passes the parent asks for."""
    backend = cache = None
    while True:
        request = pipe.recv()
        if request[0] == "stop":
            return
        if request[0] == "load":
            started = time.perf_counter()
            if kind == "torch":
                import torch

                from remote_verify.backends.torch_backend import TorchTarget

                if threads:
                    torch.set_num_threads(threads)
                backend = TorchTarget(path, device="cpu")
            else:
                from remote_verify.backends.onnx_backend import OnnxTarget

                backend = OnnxTarget(path, device="cpu", threads=threads)
            pipe.send((time.perf_counter() - started, _resident_mib(), backend.vocab_size))
        elif request[0] == "prefill":  # ("prefill", tokens): a new cache holding them
            cache = backend.new_cache()
            started = time.perf_counter()
            backend.forward(cache, request[1], n_logits=1)
            pipe.send((time.perf_counter() - started, _resident_mib()))
        elif request[0] == "logits":  # ("logits", tokens): every position's logits, from an empty cache
            pipe.send(backend.forward(backend.new_cache(), request[1], n_logits=len(request[1])))
        elif request[0] == "verify":  # ("verify", block, keep): one pass, then roll back to keep
            started = time.perf_counter()
            backend.forward(cache, request[1], n_logits=len(request[1]))
            elapsed = time.perf_counter() - started
            backend.truncate(cache, request[2])
            pipe.send(elapsed)


def _resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    main()
