"""Many concurrent sessions against one verification service: latency, parity, memory.

    .venv/bin/python -m benchmarks.load [--sessions 32] [--rounds 50] [--k 4]
                                        [--backend llamacpp|torch] [--attack N] [--json]
                                        [--batch-tokens N] [--compare 1,4,8,16,32] [--torch-static]

Builds the tiny models in a temporary folder (or takes --target/--draft), starts
`specwire serve` as a child process, and computes each prompt's reference continuation
with `--k 0` through that service (the target alone, one token a round). Then a warm-up
wave of sessions opens and closes (the memory baseline is read after it, so that the
allocator's first growth is not counted as a leak), and the measured wave runs: every
session connects, all start together, and each generates greedily, prompt after prompt,
until it has done at least --rounds verification rounds. Every reply must equal its
reference. Prints verify latency percentiles (round trip at the client, time queued for
the device, the service's forward pass and acceptance), errors, and the service's
resident memory before, at the peak of, and after the wave. `--attack N` runs the load
alone and then beside N attacking connections instead (benchmarks/attack.py).

`--compare 1,4,8,16,32` runs the load at each session count twice, side by side in one
run: the queue (`serve --batch-tokens 0`, one session's round a pass) and shared passes
(`--batch-tokens`, default 256). It prints, for each, the aggregate verified tokens/s (tokens
of every reply over the wave's wall time), target passes/s (the service's own count), the
sessions a pass served on average, p50/p99 round trip, and the replies that differ from the
target alone; ratios are what to read on a machine others share.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.session_wave import (
    MIB, PROMPTS, Service, percentiles, reference_continuations, run_wave, wait_until_closed,
)
from local_draft.draft_model import DraftModel


@dataclass
class LoadReport:
    sessions: int
    rounds: int
    min_rounds: int
    generations: int
    errors: list[str]
    mismatches: list[str]
    wall_s: float
    round_trip_s: dict[str, float]
    queue_s: dict[str, float]
    service_s: dict[str, float]
    rss_before_mib: float
    rss_peak_mib: float
    rss_after_mib: float
    sessions_open_after: float
    tokens: int = 0  # in every reply of the measured wave
    target_passes: float = 0.0  # forward passes the service ran in the measured wave
    micro_batches: float = 0.0  # llama.cpp micro-batches those passes ran in (0 on other backends)
    padding_tokens: float = 0.0  # tokens computed and thrown away to make a pass one micro-batch
    batch_tokens: int | None = None  # the service's --batch-tokens (None: its default)
    prompts: list[list[int]] = field(default_factory=list)
    references: list[list[int]] = field(default_factory=list)  # each prompt continued by the target alone

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def run_load(target: Path, draft_path: Path, backend: str = "llamacpp", sessions: int = 32, rounds: int = 50,
             k: int = 4, max_tokens: int = 48, warmup_rounds: int = 4, pin_service: bool = False,
             batch_tokens: int | None = None, replay: bool = False, n_prompts: int = len(PROMPTS),
             service_args: tuple[str, ...] = ()) -> LoadReport:
    service = Service(target, backend, max_sessions=sessions, pinned=pin_service, batch_tokens=batch_tokens,
                      extra_args=service_args)
    try:
        tokenizer = DraftModel(draft_path, n_ctx=1024, n_threads=1)
        prompts = [tokenizer.tokenize(text) for text in PROMPTS[:n_prompts]]
        references = reference_continuations(service.url, tokenizer, prompts, max_tokens)
        warm, _ = run_wave(service.url, draft_path, prompts, references, sessions, warmup_rounds, k, max_tokens,
                           replay=replay)
        wait_until_closed(service)
        before = service.rss()
        peak = [before]
        passes_before = service.metric("specwire_target_passes")
        micro_before = service.metric("specwire_target_micro_batches")
        padding_before = service.metric("specwire_target_padding_tokens")
        results, wall = run_wave(service.url, draft_path, prompts, references, sessions, rounds, k, max_tokens,
                                 on_tick=lambda: peak.append(service.rss()), replay=replay)
        open_after = wait_until_closed(service)
        passes = service.metric("specwire_target_passes") - passes_before
        micro_batches = service.metric("specwire_target_micro_batches") - micro_before
        padding = service.metric("specwire_target_padding_tokens") - padding_before
        after = service.rss()
    finally:
        service.close()
    samples = [sample for result in results for sample in result.samples]
    return LoadReport(
        sessions=sessions, rounds=sum(r.rounds for r in results), min_rounds=min(r.rounds for r in results),
        generations=sum(r.generations for r in results),
        errors=[r.error for r in warm + results if r.error],
        mismatches=[m for r in warm + results for m in r.mismatches], wall_s=wall,
        round_trip_s=percentiles([s[0] for s in samples]), queue_s=percentiles([s[1] for s in samples]),
        service_s=percentiles([s[2] for s in samples]),
        rss_before_mib=before / MIB, rss_peak_mib=max(peak) / MIB, rss_after_mib=after / MIB,
        sessions_open_after=open_after, tokens=sum(r.tokens for r in results), target_passes=passes,
        micro_batches=micro_batches, padding_tokens=padding,
        batch_tokens=batch_tokens, prompts=prompts, references=references)


def compare(target: Path, draft_path: Path, backend: str, session_counts: list[int], rounds: int, k: int,
            max_tokens: int, batch_tokens: int, pin_service: bool = False, replay: bool = False,
            n_prompts: int = len(PROMPTS), repeat: int = 1, service_args: tuple[str, ...] = ()) -> list[dict]:
    """The queue and shared passes at each session count, alternating `repeat` times in one run
    (a machine others use changes speed from minute to minute); each mode's row is its run of
    median tokens/s."""
    rows = []
    for sessions in session_counts:
        runs: dict[str, list[dict]] = {"queue": [], "batched": []}
        for _ in range(repeat):
            for mode, budget in (("queue", 0), ("batched", batch_tokens)):
                report = run_load(target, draft_path, backend, sessions, rounds, k, max_tokens,
                                  pin_service=pin_service, batch_tokens=budget, replay=replay, n_prompts=n_prompts,
                                  service_args=service_args)
                runs[mode].append(dict(
                    sessions=sessions, mode=mode, batch_tokens=budget, wall_s=report.wall_s,
                    tokens=report.tokens, rounds=report.rounds, tokens_per_s=report.tokens / report.wall_s,
                    passes_per_s=report.target_passes / report.wall_s,
                    rounds_per_pass=report.rounds / max(report.target_passes, 1),
                    micro_batches_per_pass=report.micro_batches / max(report.target_passes, 1),
                    padding_per_token=report.padding_tokens / max(report.tokens, 1),
                    round_trip_p50_ms=report.round_trip_s["p50"] * 1000,
                    round_trip_p99_ms=report.round_trip_s["p99"] * 1000,
                    queue_p50_ms=report.queue_s["p50"] * 1000,
                    errors=len(report.errors), mismatches=len(report.mismatches),
                    problems=(report.errors + report.mismatches)[:3]))
                log_row(runs[mode][-1])
        for mode in ("queue", "batched"):
            ordered = sorted(runs[mode], key=lambda row: row["tokens_per_s"])
            median = dict(ordered[len(ordered) // 2])
            median["errors"] = sum(row["errors"] for row in ordered)  # every run's replies are checked
            median["mismatches"] = sum(row["mismatches"] for row in ordered)
            median["problems"] = [problem for row in ordered for problem in row["problems"]][:3]
            rows.append(median)
    return rows


def log_row(row: dict) -> None:
    print(f"  {row['sessions']:>3} sessions {row['mode']:>8}: {row['tokens_per_s']:8.1f} tokens/s "
          f"{row['passes_per_s']:7.1f} passes/s  rounds/pass {row['rounds_per_pass']:5.2f}  micro-batches/pass "
          f"{row['micro_batches_per_pass']:4.2f}  round trip p50 "
          f"{row['round_trip_p50_ms']:7.1f} p99 {row['round_trip_p99_ms']:7.1f} ms  differing {row['mismatches']}, "
          f"errors {row['errors']}", file=sys.stderr, flush=True)


def print_comparison(rows: list[dict], k: int) -> None:
    print(f"k = {k}; queue: one session's round a pass; batched: the waiting sessions' rounds share a pass")
    print("micro-batches/pass: llama.cpp's graph runs a pass took; padding/token: tokens computed and thrown "
          "away to make a pass one, per verified token")
    print("sessions | mode    | tokens/s | passes/s | rounds/pass | micro-batches/pass | padding/token | "
          "round trip p50 / p99 ms | differing replies | errors")
    for row in rows:
        print(f"{row['sessions']:>8} | {row['mode']:<7} | {row['tokens_per_s']:8.1f} | {row['passes_per_s']:8.1f} | "
              f"{row['rounds_per_pass']:11.2f} | {row['micro_batches_per_pass']:18.2f} | "
              f"{row['padding_per_token']:13.2f} | {row['round_trip_p50_ms']:10.1f} / {row['round_trip_p99_ms']:8.1f} | "
              f"{row['mismatches']:>17} | {row['errors']:>6}")
    print("batched / queue at each session count:")
    for queue, batched in zip(rows[::2], rows[1::2]):
        print(f"  {queue['sessions']:>3} sessions: tokens/s x{batched['tokens_per_s'] / queue['tokens_per_s']:.2f}, "
              f"p99 round trip x{batched['round_trip_p99_ms'] / queue['round_trip_p99_ms']:.2f}")
    for row in rows:
        for problem in row["problems"]:
            print(f"  {row['sessions']} {row['mode']}: {problem}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=50, help="at least this many rounds per session")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per reply")
    parser.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch"])
    parser.add_argument("--target", help="target model (default: the tiny one)")
    parser.add_argument("--draft", help="draft model GGUF (default: the tiny one)")
    parser.add_argument("--pin-service", action="store_true", help="run the service on one CPU (Linux)")
    parser.add_argument("--attack", type=int, default=0, metavar="N",
                        help="instead: the load alone and beside N attacking connections, then the memory "
                        "attack (benchmarks/attack.py; tiny models, llama.cpp)")
    parser.add_argument("--batch-tokens", type=int, default=None, metavar="N",
                        help="the service's --batch-tokens (default: its own; with --compare: 256)")
    parser.add_argument("--compare", metavar="COUNTS",
                        help="instead: the queue against shared passes at each of these session counts "
                        "(comma-separated, e.g. 1,4,8,16,32), side by side")
    parser.add_argument("--replay", action="store_true",
                        help="clients send the reference's tokens as drafts, one changed at a random place "
                        "(no drafting on the client's side): the service's capacity alone")
    parser.add_argument("--no-batch-invariant", action="store_true",
                        help="serve with --no-batch-invariant (llama.cpp's batch-shaped fast kernels: replies may "
                        "differ from the target alone at near-ties)")
    parser.add_argument("--torch-static", action="store_true",
                        help="with --backend torch: serve with --torch-static (a static KV cache a slot per "
                        "session, shared passes as one padded forward); the Hugging Face path runs rounds alone")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="with --compare: run each mode N times, alternating, and keep the median")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1),
                        metavar="N", help="use the first N prompts (their references are computed first: fewer "
                        "for a large target on a CPU)")
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE",
                        help="print JSON instead of tables (to FILE, with --emulate: one record per users and mode)")
    from benchmarks import capacity

    capacity.add_arguments(parser)
    args = parser.parse_args()
    if args.emulate:
        from benchmarks.emulation.profiles import ProfileError

        try:
            capacity.main_emulated(args)
        except (ProfileError, capacity.SettingsError) as exc:  # a misspelt --emulate or --drafter (say which
            parser.error(str(exc))  # names there are), or flags that cannot make a run
        return
    if args.torch_static and args.backend != "torch":
        parser.error("--torch-static is a mode of the torch backend: add --backend torch")
    service_args = ("--no-batch-invariant",) if args.no_batch_invariant else ()
    service_args += ("--torch-static",) if args.torch_static else ()
    if args.attack:
        from benchmarks import attack

        with tempfile.TemporaryDirectory() as folder:
            from models.tiny import build_tiny_models

            tiny = build_tiny_models(Path(folder), seed=0)
            report = attack.run(tiny.target_gguf, tiny.draft, args.sessions, args.rounds, args.attack,
                                memory_connections=args.sessions, k=args.k, max_tokens=args.max_tokens)
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            attack.print_report(report)
        return
    with tempfile.TemporaryDirectory() as folder:
        if not (args.target and args.draft):
            from models.tiny import build_tiny_models

            tiny = build_tiny_models(Path(folder), seed=0)
            target = tiny.target_gguf if args.backend == "llamacpp" else tiny.target
            args.target, args.draft = args.target or target, args.draft or tiny.draft
        if args.compare:
            counts = [int(count) for count in args.compare.split(",")]
            rows = compare(Path(args.target), Path(args.draft), args.backend, counts, args.rounds, args.k,
                           args.max_tokens, args.batch_tokens if args.batch_tokens is not None else 256,
                           pin_service=args.pin_service, replay=args.replay, n_prompts=args.prompts,
                           repeat=args.repeat, service_args=service_args)
            if args.json:
                print(json.dumps(rows, indent=1))
            else:
                print_comparison(rows, args.k)
            return
        report = run_load(Path(args.target), Path(args.draft), args.backend, args.sessions, args.rounds, args.k,
                          args.max_tokens, pin_service=args.pin_service, batch_tokens=args.batch_tokens,
                          replay=args.replay, n_prompts=args.prompts, service_args=service_args)
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
        return
    ms = lambda d: " / ".join(f"{d[p] * 1000:.1f}" for p in ("p50", "p90", "p99"))  # noqa: E731
    print(f"sessions {report.sessions}, rounds {report.rounds} (fewest in a session: {report.min_rounds}), "
          f"replies {report.generations}, wall {report.wall_s:.1f} s")
    print(f"errors {len(report.errors)}, replies differing from the target alone {len(report.mismatches)}")
    print("verify latency p50 / p90 / p99, ms:")
    print(f"  round trip at the client  {ms(report.round_trip_s)}")
    print(f"  queued for the device     {ms(report.queue_s)}")
    print(f"  forward pass + acceptance {ms(report.service_s)}")
    print(f"service memory (RSS): before {report.rss_before_mib:.1f} MiB, peak {report.rss_peak_mib:.1f} MiB, "
          f"after {report.rss_after_mib:.1f} MiB; sessions open after: {report.sessions_open_after:g}")
    for problem in report.errors + report.mismatches[:5]:
        print("  " + problem)


if __name__ == "__main__":
    main()
