"""Run the benchmark: every mode at every round-trip time over one prompt set, interleaved.

One verification service runs in a child process; one latency proxy per round-trip time
sits in front of it. Client and service stand for two machines: by default each gets half
of this machine's cores (pinned), so that drafting ahead and verifying really overlap, as
they would across a network, instead of fighting over the same cores. Each (mode, round trip) pair keeps its own generator and session for
the whole run, as a user's client would, so adaptive k learns each link. The loop goes
prompt by prompt and, within a prompt, through every round-trip time and every mode in
a rotating order, so that a slow spell of this shared machine falls on all of them alike.
Modes that use no network (offline, the outside reference) run once per prompt.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.bench.modes import Mode, Run
from app.bench.prompts import PROMPTS
from app.demo import start_service
from app.latency_proxy import LatencyProxy
from app.threads_flags import colocated_serve_flags
from wire.protocol import SamplingParams
from wire.threads import DRAFT_THREADS

log = logging.getLogger(__name__)

WARM_UP_PROMPT = "def add(a, b):"
WARM_UP_TOKENS = 24
SERVICE_CONTEXT = 2048  # prompts + replies stay far below; keeps each session's KV cache small


@dataclass(frozen=True)
class BenchConfig:
    draft: Path
    target: Path
    backend: str
    rtts_ms: list[float]
    jitter_ms: float
    modes: list[Mode]
    kinds: list[str]
    prompts_per_kind: int | None  # None: every prompt of each kind
    max_tokens: int
    params: SamplingParams = SamplingParams()  # greedy by default
    seed: int = 0
    service_cpus: int | None = None  # cores pinned to the service; None: half; 0: no pinning
    draft_threads: int = DRAFT_THREADS
    colocated: bool = False  # run twice: every core shared (as users run it), then pinned


def split_cores(service_cpus: int | None) -> tuple[set[int] | None, set[int] | None]:
    """(service cores, client cores), or (None, None) when everything shares every core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    wanted = len(cores) // 2 if service_cpus is None else service_cpus
    if wanted <= 0 or len(cores) < 2:
        return None, None
    wanted = min(wanted, len(cores) - 1)  # the client keeps at least one core
    return set(cores[-wanted:]), set(cores[:-wanted])


def bench_prompts(config: BenchConfig) -> list[tuple[str, int, str]]:
    """(kind, index, text), kinds interleaved: code, chat, prose, repeat, code, ... (adaptive k must follow)."""
    chosen = {kind: PROMPTS[kind][: config.prompts_per_kind] for kind in config.kinds}
    longest = max(len(texts) for texts in chosen.values())
    return [(kind, i, chosen[kind][i]) for i in range(longest) for kind in config.kinds if i < len(chosen[kind])]


def count_runs(config: BenchConfig) -> int:
    prompts = len(bench_prompts(config))
    networked = sum(mode.uses_network for mode in config.modes)
    local = sum(mode.kind == "offline" for mode in config.modes)
    return prompts * (networked * len(config.rtts_ms) + local)


def run_bench(config: BenchConfig, progress: Callable[[int, int], None]) -> list[Run]:
    """Every networked and offline mode; the outside reference is run apart (app.bench.reference)."""
    from local_draft.draft_model import DraftModel
    params = config.params
    service_cores, client_cores = split_cores(config.service_cpus)
    all_cores = os.sched_getaffinity(0) if client_cores else None
    if client_cores:
        os.sched_setaffinity(0, client_cores)  # before llama.cpp counts its threads
    draft = DraftModel(config.draft, n_threads=config.draft_threads)
    # Pinned, the service takes the physical cores of its half; sharing every core, it takes
    # the thread plan's share, as the chat's embedded service does (wire/threads.py).
    threads = [] if service_cores else colocated_serve_flags(config.draft_threads)
    service, url = start_service(config.target, "--backend", config.backend, "--max-context", str(SERVICE_CONTEXT),
                                 *threads, cpus=service_cores)
    proxies: list[LatencyProxy] = []
    generators: dict[tuple[str, float], object] = {}
    links = []
    runs: list[Run] = []
    total, done = count_runs(config), 0
    try:
        for rtt in config.rtts_ms:
            proxy = LatencyProxy(url, rtt_ms=rtt, jitter_ms=config.jitter_ms, seed=config.seed)
            proxy.start_in_thread()
            proxies.append(proxy)
            for mode in config.modes:
                if mode.uses_network:
                    generator, link = _generator(mode, proxy.url, draft, params, config.seed)
                    generators[mode.name, rtt] = generator
                    links.append(link)
        for mode in config.modes:
            if mode.kind == "offline":
                generators[mode.name, 0.0] = _generator(mode, None, draft, params, config.seed)[0]
        warm_up = draft.tokenize(WARM_UP_PROMPT)
        for generator in generators.values():
            generator.generate(warm_up, WARM_UP_TOKENS)  # buffers allocated, costs first measured
        progress(0, total)
        for turn, (kind, index, text) in enumerate(bench_prompts(config)):
            ids = draft.tokenize(text)
            order = _rotated([m for m in config.modes if m.kind in ("server", "stream", "hybrid", "offline")], turn)
            for rtt in config.rtts_ms:
                for mode in order:
                    if mode.kind == "offline" and rtt != config.rtts_ms[0]:
                        continue  # no network: once per prompt
                    at = 0.0 if mode.kind == "offline" else rtt
                    result = generators[mode.name, at].generate(ids, config.max_tokens)
                    runs.append(Run.from_stats(mode.name, at, kind, index, result.token_ids, result.stats))
                    done += 1
                    progress(done, total)
    finally:
        for link in links:
            link.close()
        for proxy in proxies:
            proxy.stop()
        service.terminate()
        service.wait(timeout=60)
        if all_cores:
            os.sched_setaffinity(0, all_cores)
    return runs


def _generator(mode: Mode, url: str | None, draft, params, seed: int):
    """(generator, link) for a mode; link is None when the mode needs no service."""
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.service_link import ServiceLink
    from local_draft.speculator import Speculator
    from local_draft.stream_speculator import StreamSpeculator

    if mode.kind == "offline":
        return Speculator(draft, None, params, seed=seed), None
    hello = draft.hello(params, seed=seed, client=f"specwire bench ({mode.name})")
    # A link, as a user's client has: a session the service closed while this mode waited
    # its turn (idle timeout) is reopened at once, and rebuilt from the history.
    link = ServiceLink(url, hello)
    if mode.kind == "server":
        return ServerOnlyGenerator(link, draft.end_ids), link
    if mode.kind == "stream":
        return StreamSpeculator(draft, link, params, seed=seed, max_block=mode.k, drafting=mode.drafting,
                                end_ids=draft.end_ids), link
    return Speculator(draft, link, params, k=mode.k, seed=seed, pipeline=mode.pipeline, drafting=mode.drafting,
                      end_ids=draft.end_ids), link


def _rotated(items: list, turn: int) -> list:
    shift = turn % len(items) if items else 0
    return items[shift:] + items[:shift]
