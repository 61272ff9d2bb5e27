"""The torch fast path's numbers on real shapes: verify latency, the bandwidth floor, batched throughput.

    python -m benchmarks.gpu                       # on a CUDA machine: Qwen2.5 1.5B and 7B shapes
    python -m benchmarks.gpu --device cpu --tiny   # the same measurements at a toy size (this machine)
        [--models 1.5b 7b] [--blocks 1 2 3 5 9 17] [--sessions 1 2 4 8 16 32] [--block 5]
        [--context 512] [--repeats 20] [--threads N] [--no-queued] [--sdpa math|efficient|...]
        [--draft GGUF] [--out DIR]
    python -m benchmarks.gpu --models 7b 32b --blocks 1 --sessions 1 8 32 64 128 --block 1 --no-queued
                                                   # the decode batch curve: passes of 1 token a session

Weights are random, built from the configurations written out below (no download): speed
depends on shapes, not values. bfloat16 on CUDA, float32 on the CPU.

- Verify latency, for each block of b tokens (k = b - 1 drafts and the last committed token):
  a session with --context tokens cached runs one pass of b tokens and rolls it back. "eager"
  is today's torch backend (Hugging Face forward with a DynamicCache, b rows of logits copied
  to the host); "fast" is the static path (remote_verify/backends/torch_static.py: static KV
  slot, CUDA graphs on a GPU, argmax on the device, b integers to the host). Medians.
- The bandwidth floor: a pass reads every weight once, so it cannot beat weight bytes /
  memory bandwidth; the bandwidth is measured by copying a large buffer on the device.
- Batched throughput: N sessions (N in --sessions) each verify a block of --block tokens;
  "fast" runs all N passes as one forward (forward_many), "eager" one after another, as
  the queue does today. Tokens/s counts verified block tokens over all sessions.
- Agreement: the fast path's argmax against eager's at every timed position, and on CUDA
  the graphed forward against the same forward run eagerly (it must be the same numbers).
  Random weights give flat distributions, so bfloat16 near-ties can flip an argmax
  between kernels; the tiny target's peaked logits (tests/) are where exactness is tested.
- --draft GGUF (the drafter): ms per drafted token with llama.cpp on the GPU beside the CPU.

Prints a table and writes DIR/gpu.json (DIR: benchmarks/results/gpu-<device>), and the
measurements as device profiles for the emulator (benchmarks/emulation/profiles.py), in the
shipped profiles' format, marked `measured = true`: DIR/profile-<model>-fast.toml and
-eager.toml (each pass of 1 to 17 tokens, then the batched rounds as passes of their total
tokens), and with --draft DIR/profile-drafter-gpu.toml (and -cpu): copy them into
benchmarks/emulation/profiles/ to calibrate the emulated figures against the real thing.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

# Written out from the models' config.json files, so the benchmark needs no download.
CONFIGS = {
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
               rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False),
    # one GPU's largest: 65.5 GB of bfloat16 weights (Qwen2.5-32B's config.json)
    "32b": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                num_key_value_heads=8, vocab_size=152064, max_position_embeddings=32768,
                rms_norm_eps=1e-5, rope_theta=1000000.0, tie_word_embeddings=False),
    # the tiny factory's shape (models/tiny.py) with Qwen's vocabulary cut to 2k: seconds on a CPU
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=2048, max_position_embeddings=4096,
                 rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False),
}
WARMUP = 3  # untimed runs per shape: CUDA graph capture, cuBLAS algorithm choice, page faults

log = logging.getLogger(__name__)


def build_model(name: str, device: torch.device, dtype: torch.dtype):
    """A Qwen2ForCausalLM of the named shape with random weights, on the device."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**CONFIGS[name], use_sliding_window=False, hidden_act="silu")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def weight_bytes_read(model) -> int:
    """Bytes a pass reads: every weight once; the input embedding only where it is the output head."""
    embed = model.model.embed_tokens.weight
    tied = model.get_output_embeddings().weight.data_ptr() == embed.data_ptr()
    seen, total = set(), 0
    for param in model.parameters():
        if param.data_ptr() in seen or (param is embed and not tied):
            continue
        seen.add(param.data_ptr())
        total += param.numel() * param.element_size()
    return total


def copy_bandwidth(device: torch.device, megabytes: int) -> float:
    """Bytes per second the device moves in a large copy (each byte read once and written once)."""
    source = torch.ones(megabytes << 18, dtype=torch.float32, device=device)  # megabytes MiB
    target = torch.empty_like(source)
    times = []
    for _ in range(WARMUP + 10):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / statistics.median(times[WARMUP:])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class EagerSession:
    """Today's torch backend's pass: HF forward with a DynamicCache, logits copied to the host."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model, self.cache = model, DynamicCache()

    @torch.inference_mode()
    def forward(self, tokens: list[int], n_logits: int) -> np.ndarray:
        ids = torch.tensor([tokens], device=self.model.device)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=n_logits)
        return out.logits[0, -n_logits:].float().cpu().numpy()  # (n_logits, V)

    def truncate(self, length: int) -> None:
        surplus = self.cache.get_seq_length() - length
        if surplus > 0:
            self.cache.crop(-surplus)


def median_ms(repeats: int, *runs) -> list[float]:
    """Median milliseconds of each run; the runs take turns, so a busy moment of a shared
    machine falls on all of them alike."""
    for run in runs:
        for _ in range(WARMUP):
            run()
    times = [[] for _ in runs]
    for _ in range(repeats):
        for run, spent in zip(runs, times):
            start = time.perf_counter()
            run()  # ends with a copy to the host: the device has finished
            spent.append(time.perf_counter() - start)
    return [1000 * statistics.median(spent) for spent in times]


def attention_kernel(choice: str):
    """A context in which attention runs only on the chosen kernel (graphs captured in it keep it)."""
    import contextlib

    if choice == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[choice])


def measure_model(name: str, device: torch.device, args) -> dict:
    from remote_verify.backends.target import Pass
    from remote_verify.backends.torch_static import StaticEngine

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    model = build_model(name, device, dtype)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    sessions = max(args.sessions)
    context = args.context + max(args.blocks + [args.block]) + 1
    engine = StaticEngine(model, slots=sessions, context=context, cuda_graphs=not args.no_graphs)
    log.info("%s: built in %.1f s", name, time.perf_counter() - started)
    result = {"model": name, "dtype": str(dtype).removeprefix("torch."), "context": args.context,
              "weight_bytes": weight_bytes_read(model), "blocks": [], "batched": []}
    bandwidth = copy_bandwidth(device, args.copy_mib)
    result["copy_bandwidth_gb_s"] = bandwidth / 1e9
    result["floor_ms"] = 1000 * result["weight_bytes"] / bandwidth

    prompt = rng.integers(0, vocab, args.context).tolist()
    eager = EagerSession(model)
    eager.forward(prompt, 1)
    fast = engine.new_cache()
    engine.forward_many([Pass(fast, prompt, 1, argmax_only=True)])
    agree = total = 0
    for b in args.blocks:
        block = rng.integers(0, vocab, b).tolist()

        def eager_pass():
            eager.forward(block, b)
            eager.truncate(args.context)

        def fast_pass():
            engine.forward_many([Pass(fast, block, b, argmax_only=True)])
            engine.truncate(fast, args.context)

        eager_ms, fast_ms = median_ms(args.repeats, eager_pass, fast_pass)
        row = {"block": b, "eager_ms": eager_ms, "fast_ms": fast_ms}
        ids = engine.forward_many([Pass(fast, block, b, argmax_only=True)])[0]
        engine.truncate(fast, args.context)
        reference = eager.forward(block, b).argmax(-1)
        eager.truncate(args.context)
        agree, total = agree + int((ids == reference).sum()), total + b
        result["blocks"].append(row)
        log.info("%s: block %d: eager %.2f ms, fast %.2f ms", name, b, eager_ms, fast_ms)
    result["argmax_agreement"] = agree / total
    one_token = result["blocks"][0]["fast_ms"] if args.blocks[0] == 1 else None
    for row in result["blocks"]:
        row["fast_vs_one_token"] = row["fast_ms"] / one_token if one_token else None
    if engine.graphs is not None:
        result["graph_vs_eager_static_max_diff"] = graph_difference(model, engine, prompt, rng, args)
    engine.release(fast)

    caches = [engine.new_cache() for _ in range(sessions)]
    eagers = [] if args.no_queued else [EagerSession(model) for _ in range(sessions)]
    for i, cache in enumerate(caches):
        context_tokens = rng.integers(0, vocab, args.context).tolist()
        engine.forward_many([Pass(cache, context_tokens, 1, argmax_only=True)])
        if eagers:
            eagers[i].forward(context_tokens, 1)
    blocks = [rng.integers(0, vocab, args.block).tolist() for _ in range(sessions)]
    for n in args.sessions:
        def batched():
            engine.forward_many([Pass(c, t, args.block, argmax_only=True) for c, t in zip(caches[:n], blocks)])
            for cache in caches[:n]:
                engine.truncate(cache, args.context)

        def queued():
            for session, tokens in zip(eagers[:n], blocks):
                session.forward(tokens, args.block)
                session.truncate(args.context)

        if args.no_queued:  # n one-session passes: only a multiple of the block rows above
            fast_ms, eager_ms = median_ms(args.repeats, batched)[0], None
        else:
            fast_ms, eager_ms = median_ms(args.repeats, batched, queued)
        log.info("%s: %d sessions: eager round %s ms, fast round %.2f ms", name, n,
                 "-" if eager_ms is None else f"{eager_ms:.2f}", fast_ms)
        result["batched"].append({"sessions": n, "fast_round_ms": fast_ms, "eager_round_ms": eager_ms,
                                  "fast_tokens_s": n * args.block / fast_ms * 1000,
                                  "eager_tokens_s": None if eager_ms is None else n * args.block / eager_ms * 1000})
    base = result["batched"][0]["fast_tokens_s"] if args.sessions[0] == 1 else None
    for row in result["batched"]:
        row["fast_vs_one_session"] = row["fast_tokens_s"] / base if base else None
    for cache in caches:
        engine.release(cache)
    del engine, model, eagers
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def graph_difference(model, engine, prompt, rng, args) -> float:
    """Largest |logit| difference between the graphed forward and the same forward run eagerly."""
    from remote_verify.backends.target import Pass
    from remote_verify.backends.torch_static import StaticEngine

    plain = StaticEngine(model, slots=1, context=engine.context, cuda_graphs=False)
    worst = 0.0
    for b in args.blocks:
        block = rng.integers(0, model.config.vocab_size, b).tolist()
        outputs = []
        for each in (engine, plain):
            cache = each.new_cache()
            each.forward_many([Pass(cache, prompt, 1)])
            outputs.append(each.forward_many([Pass(cache, block, b)])[0])
            each.release(cache)
        worst = max(worst, float(np.abs(outputs[0] - outputs[1]).max()))
    return worst


def measure_drafter(path: Path, repeats: int) -> dict:
    """ms per drafted token (greedy, 16 a block) and per token of a 256-token prompt read at
    once, with llama.cpp on the GPU and on the CPU."""
    import llama_cpp

    from local_draft.draft_model import DraftModel
    from wire.protocol import SamplingParams

    result = {"draft": str(path), "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload())}
    for where, layers in (("gpu", -1), ("cpu", 0)):
        if where == "gpu" and not result["gpu_offload"]:
            result["gpu_ms_per_token"] = None
            continue
        draft = DraftModel(path, n_ctx=1024, gpu_layers=layers)
        context = draft.tokenize("def quicksort(arr):\n")
        rng = np.random.default_rng(0)

        def block():
            draft.propose(context, 16, SamplingParams(), rng)
            draft.rollback(len(context))

        prompt = (context * 64)[:256]

        def read():
            draft.keep_up(prompt)
            draft.rollback(0)

        result[f"{where}_ms_per_token"] = median_ms(repeats, block)[0] / 16
        result[f"{where}_prefill_ms_per_token"] = median_ms(repeats, read)[0] / len(prompt)
        del draft
    return result


def write_profiles(report: dict, out: Path) -> list[Path]:
    """The measurements as emulator profiles (benchmarks/emulation/profiles.py's format)."""
    written = []
    device = report["device"]
    for m in report["models"]:
        for path_name, column, round_column in (("fast", "fast_ms", "fast_round_ms"),
                                                ("eager", "eager_ms", "eager_round_ms")):
            points = {r["block"]: r[column] for r in m["blocks"]}
            # a batched round is a pass of its sessions' tokens: their per-session costs are in it
            points.update({r["sessions"] * report["block"]: r[round_column] for r in m["batched"]
                           if r["sessions"] * report["block"] not in points and r[round_column] is not None})
            lines = [f'name = "measured-{m["model"]}-{path_name}"', 'kind = "target"', "measured = true",
                     f'description = "{device}, a {m["model"]} Qwen2.5 shape ({m["dtype"]}), the torch backend\'s '
                     f'{path_name} path, {m["context"]} tokens cached"',
                     "pass_ms = [" + ", ".join(f"[{n}, {ms:.4f}]" for n, ms in sorted(points.items())) + "]",
                     "session_ms = 0.0  # inside the batched points", "context_ms_per_ktoken = 0.0  # not measured",
                     "", "[sources]",
                     f'pass_ms = "python -m benchmarks.gpu on {device}, torch {report["torch"]}: passes of 1 to '
                     f'{max(r["block"] for r in m["blocks"])} tokens, and batched rounds of {report["block"]} tokens a '
                     f'session as passes of their total"',
                     'session_ms = "folded into the batched points"', 'context_ms_per_ktoken = "not measured"']
            path = out / f"profile-{m['model']}-{path_name}.toml"
            path.write_text("\n".join(lines) + "\n")
            written.append(path)
    drafter = report.get("drafter")
    for where in ("gpu", "cpu"):
        if drafter and drafter.get(f"{where}_ms_per_token"):
            path = out / f"profile-drafter-{where}.toml"
            path.write_text("\n".join([
                f'name = "measured-drafter-{where}"', 'kind = "drafter"', "measured = true",
                f'description = "{Path(drafter["draft"]).name} with llama.cpp on the {where.upper()} of {device}"',
                f'token_ms = {drafter[f"{where}_ms_per_token"]:.4f}',
                f'prefill_ms_per_token = {drafter[f"{where}_prefill_ms_per_token"]:.4f}', "", "[sources]",
                f'token_ms = "python -m benchmarks.gpu --draft: 16-token greedy blocks"',
                f'prefill_ms_per_token = "python -m benchmarks.gpu --draft: a 256-token prompt read at once"']) + "\n")
            written.append(path)
    return written


def table(report: dict) -> str:
    lines = [f"device: {report['device']}"]
    for m in report["models"]:
        lines.append(f"\n{m['model']} ({m['dtype']}), {m['context']} tokens cached; weights read per pass "
                     f"{m['weight_bytes'] / 1e6:,.1f} MB, copy bandwidth {m['copy_bandwidth_gb_s']:.0f} GB/s, "
                     f"floor {m['floor_ms']:.2f} ms")
        lines.append(f"{'block':>6} {'eager ms':>9} {'fast ms':>8} {'eager/fast':>10} {'fast/1-token':>12} "
                     f"{'fast/floor':>10}")
        for r in m["blocks"]:
            ratio = f"{r['fast_vs_one_token']:.2f}" if r["fast_vs_one_token"] else "-"
            lines.append(f"{r['block']:>6} {r['eager_ms']:>9.2f} {r['fast_ms']:>8.2f} "
                         f"{r['eager_ms'] / r['fast_ms']:>10.2f} {ratio:>12} {r['fast_ms'] / m['floor_ms']:>10.2f}")
        lines.append(f"argmax agreement fast/eager {m['argmax_agreement']:.3f}" + (
            f"; graphed vs eager static forward: max |logit diff| {m['graph_vs_eager_static_max_diff']:.3g}"
            if "graph_vs_eager_static_max_diff" in m else ""))
        lines.append(f"{'sessions':>8} {'eager round ms':>14} {'fast round ms':>13} {'eager tok/s':>11} "
                     f"{'fast tok/s':>10} {'fast/1 session':>14}")
        for r in m["batched"]:
            ratio = f"{r['fast_vs_one_session']:.2f}" if r["fast_vs_one_session"] else "-"
            queued = ("-", "-") if r["eager_round_ms"] is None else (f"{r['eager_round_ms']:.2f}",
                                                                    f"{r['eager_tokens_s']:.0f}")
            lines.append(f"{r['sessions']:>8} {queued[0]:>14} {r['fast_round_ms']:>13.2f} "
                         f"{queued[1]:>11} {r['fast_tokens_s']:>10.0f} {ratio:>14}")
    if report.get("drafter"):
        d = report["drafter"]
        gpu = f"{d['gpu_ms_per_token']:.2f}" if d.get("gpu_ms_per_token") else "n/a (no GPU offload)"
        lines.append(f"\ndrafter {Path(d['draft']).name}: {gpu} ms/token on the GPU, "
                     f"{d['cpu_ms_per_token']:.2f} on the CPU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true",
                        help="the tiny shape only, few repeats: a check that runs anywhere")
    parser.add_argument("--models", nargs="+", default=None, choices=sorted(CONFIGS), help="default: 1.5b 7b")
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 2, 3, 5, 9, 17], help="verify block lengths")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--block", type=int, default=5, help="block length of the batched rounds (k = 4)")
    parser.add_argument("--context", type=int, default=512, help="tokens cached per session before timing")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--copy-mib", type=int, default=1024, help="buffer copied to measure bandwidth")
    parser.add_argument("--no-graphs", action="store_true", help="the static path without CUDA graphs")
    parser.add_argument("--sdpa", choices=["default", "math", "efficient", "flash", "cudnn"], default="default",
                        help="the attention kernel torch's scaled_dot_product_attention may use (default: its own pick)")
    parser.add_argument("--no-queued", action="store_true",
                        help="batched rounds only: skip timing the same sessions' passes one after another "
                             "(eager, the slow part at many sessions of a large model)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own; on a shared "
                        "machine 1 keeps OpenMP threads from waiting for each other)")
    parser.add_argument("--draft", type=Path, help="a drafter GGUF to time on the GPU and the CPU")
    parser.add_argument("--out", type=Path, help="folder for gpu.json (default: benchmarks/results/gpu-<device>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("torch sees no CUDA device: run on a CUDA machine, or pass --device cpu --tiny")
    if args.tiny:
        args.models = args.models or ["tiny"]
        args.context, args.repeats, args.copy_mib = min(args.context, 64), min(args.repeats, 5), 64
    models = args.models or ["1.5b", "7b"]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"{platform.processor() or 'cpu'}, " \
        f"{torch.get_num_threads()} threads"
    with attention_kernel(args.sdpa):
        report = {"device": name, "torch": torch.__version__, "block": args.block, "sdpa": args.sdpa,
                  "models": [measure_model(m, device, args) for m in models]}
    if args.draft:
        report["drafter"] = measure_drafter(args.draft, args.repeats)
    out = args.out or Path(__file__).parent / "results" / f"gpu-{device.type}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(report, indent=1))
    profiles = write_profiles(report, out)
    print(table(report))
    print(f"\nwrote {out / 'gpu.json'}" + "".join(f"\nwrote {path} (an emulator profile)" for path in profiles))
    return report


if __name__ == "__main__":
    main()
