"""`specwire bench`: parse the choices, run the modes, print the tables, write JSON and a plot."""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace
from pathlib import Path

from app.bench.modes import DEFAULT_MODES, MODES_BY_NAME
from app.bench.prompts import PROMPTS
from app.bench.report import (
    PINNED, SHARED, render_checks, render_ngram_checks, render_sources, render_stream_checks, render_tables,
    summarize, write_json, write_plot,
)
from app.bench.runner import BenchConfig, count_runs, run_bench
from app.generation_flags import add_sampling_arguments, sampling_params
from app.model_paths import resolve_model
from app.threads_flags import add_draft_threads_argument
from app.user_error import UserError

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="every mode side by side under emulated round-trip times: "
                           "tokens/s, target passes, round trips and bytes per token (table, JSON, plot)")
    add_arguments(bench)
    bench.set_defaults(run=bench_command)


def bench_command(args: argparse.Namespace) -> int:
    draft = resolve_model(args.draft, args.pair, "draft")
    target = resolve_model(args.target, args.pair, "target")
    try:
        config = parse(args, draft, target)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    run(config, Path(args.out) if args.out else default_out_dir())
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", help="model pair (default: the default pair)")
    parser.add_argument("--draft", help="draft model GGUF (default: the draft of --pair)")
    parser.add_argument("--target", help="target model (default: the target of --pair)")
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "llamacpp"],
                        help="the service's target engine (default: auto)")
    parser.add_argument("--rtt-ms", default="0,20,50,100", help="round-trip times to emulate (default: %(default)s)")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="+- spread of each round trip (default: 0)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"which modes, comma-separated (default: %(default)s; all: {','.join(MODES_BY_NAME)})")
    parser.add_argument("--kinds", default=",".join(PROMPTS), help="prompt kinds (default: %(default)s)")
    parser.add_argument("--prompts-per-kind", type=int, default=None, help="the first N prompts of each kind")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per reply (default: 128)")
    add_sampling_arguments(parser, seed=0)
    parser.add_argument("--service-cpus", type=int, default=0,
                        help="cores pinned to the local service, the rest to the client, as if on two machines "
                             "(default: 0, no pinning: both share every core, as users run them)")
    parser.add_argument("--colocated", action="store_true",
                        help="run every mode twice, as users run it (service and drafter share every core, "
                             "threads by the thread plan: modes marked /shared) and pinned (/pinned), in one table")
    add_draft_threads_argument(parser)
    parser.add_argument("--out", help="folder for bench.json and bench.png (default: ./specwire-bench-TIME)")


def parse(args: argparse.Namespace, draft: str, target: str) -> BenchConfig:
    """A BenchConfig from the flags; ValueError with a message a user can act on."""
    try:
        rtts = [float(x) for x in args.rtt_ms.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rtt-ms takes comma-separated milliseconds, like 0,50,100 (got {args.rtt_ms!r})") from None
    if not rtts or min(rtts) < 0:
        raise ValueError("--rtt-ms needs at least one round-trip time, none negative")
    unknown = [m for m in args.modes.split(",") if m not in MODES_BY_NAME]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES_BY_NAME)}")
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in PROMPTS for k in kinds):
        raise ValueError(f"--kinds: choose from {', '.join(PROMPTS)}")
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be at least 1")
    return BenchConfig(draft=Path(draft), target=Path(target), backend=args.backend, rtts_ms=rtts,
                       jitter_ms=args.jitter_ms, modes=[MODES_BY_NAME[m] for m in args.modes.split(",")],
                       kinds=kinds, prompts_per_kind=args.prompts_per_kind, max_tokens=args.max_tokens,
                       params=sampling_params(args), seed=args.seed, service_cpus=args.service_cpus,
                       draft_threads=args.draft_threads, colocated=args.colocated)


def run(config: BenchConfig, out_dir: Path) -> dict:
    """Run everything; print the report; returns the paths written."""
    from app.bench.reference import reference_available, run_reference
    from app.progress import ProgressBar

    notes = []
    if config.colocated:  # the shared layout first, then the pinned one; interleaving them would need two services
        runs = []
        for layout, service_cpus in ((SHARED, 0), (PINNED, config.service_cpus or None)):
            layout_config = replace(config, service_cpus=service_cpus)
            bar = ProgressBar(f"bench ({layout}): {count_runs(config)} runs", unit="runs", scale=1)
            runs += [replace(run, mode=f"{run.mode}/{layout}") for run in run_bench(layout_config, bar)]
    else:
        runs = run_bench(config, ProgressBar(f"bench: {count_runs(config)} runs", unit="runs", scale=1))
    if any(mode.kind == "reference" for mode in config.modes):
        missing = reference_available()
        if missing:
            notes.append(f"hf-assisted left out: {missing}")
        else:
            runs += run_reference(config, ProgressBar("bench: hf-assisted", unit="runs", scale=1))
    lost = sum(run.offline_tokens for run in runs)
    if lost:
        notes.append(f"the service was lost during the run: {lost} tokens were made offline, unverified")
    cells = summarize(runs)
    print(render_tables(cells, config.rtts_ms, config.kinds))
    for layout in (SHARED, PINNED) if config.colocated else ("",):
        print(render_checks(cells, config.rtts_ms, config.kinds, layout))
        print(render_ngram_checks(cells, config.rtts_ms, config.kinds, layout))
    print(render_sources(cells))
    for layout in (SHARED, PINNED) if config.colocated else ("",):
        print(render_stream_checks(cells, config.rtts_ms, config.kinds, layout))
    for note in notes:
        print(f"note: {note}")
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, plot_path = out_dir / "bench.json", out_dir / "bench.png"
    settings = {"draft": str(config.draft), "target": str(config.target), "backend": config.backend,
                "rtts_ms": config.rtts_ms, "jitter_ms": config.jitter_ms, "modes": [m.name for m in config.modes],
                "kinds": config.kinds, "prompts_per_kind": config.prompts_per_kind,
                "max_tokens": config.max_tokens, "temperature": config.params.temperature,
                "top_k": config.params.top_k, "top_p": config.params.top_p, "seed": config.seed,
                "service_cpus": config.service_cpus, "draft_threads": config.draft_threads,
                "colocated": config.colocated}
    write_json(json_path, settings, runs, cells, notes)
    written = {"json": str(json_path)}
    if write_plot(plot_path, cells, config.rtts_ms, config.kinds):
        written["plot"] = str(plot_path)
    print("\n" + "\n".join(f"wrote {path}" for path in written.values()))
    return written


def default_out_dir() -> Path:
    return Path(f"specwire-bench-{time.strftime('%Y%m%d-%H%M%S')}")

