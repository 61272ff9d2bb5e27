"""The honest load beside attacking connections: what honest clients see, what the service keeps.

    .venv/bin/python -m benchmarks.attack [--sessions 32] [--rounds 20] [--attackers 4]
                                          [--memory-connections 32] [--json]
    .venv/bin/python -m benchmarks.load --attack 4 ...      (the same, from the load benchmark)

Starts `specwire serve` on the tiny models (pinned to one CPU, like `benchmarks.load`),
then runs, one after another:

1. the honest load: --sessions concurrent sessions generating greedily for at least
   --rounds rounds each, every reply checked against the target alone;
2. the same load beside --attackers connections, each sending the 1 MiB frame of the
   issue over and over (`{"type": "sync", "seq": "x", "tokens": [[]] * 1048000}`: typed
   decoding fails at `seq`), each from its own process;
3. the memory attack: --memory-connections connections, each pipelining 12 well-formed
   Syncs of a million token ids (every one refused), from four processes.

Prints the honest clients' round trip p50 / p99 / worst and their rounds per second with
and without the attack, the frames the attackers sent, and the service's resident memory
before, at the peak of, and after the memory attack.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import threading
import time
from pathlib import Path

import msgspec

from wire.protocol import SUBPROTOCOL, Sync, encode

# The attackers' processes import this module afresh (spawn): what the honest side needs
# (llama.cpp among it) is imported in run(), so that an attacker starts in a moment.

STALL_FRAME = {"type": "sync", "seq": "x", "tokens": [[]] * 1048000}
PIPELINED = 12


def _attack(url: str, hello: bytes, shape: str, connections: int, pipelined: int, stop, sent) -> None:
    """In its own process: `connections` connections sending `shape` frames until `stop` (or,
    pipelined, one batch each)."""
    from websockets.sync.client import connect

    frame = msgspec.msgpack.encode(STALL_FRAME) if shape == "stall" else encode(Sync(seq=1, tokens=[1] * 1040000))

    def one() -> None:
        try:
            with connect(url, subprotocols=[SUBPROTOCOL], max_size=None, open_timeout=60) as ws:
                ws.send(hello)
                ws.recv(timeout=60)
                while not stop.is_set():
                    for _ in range(pipelined):
                        ws.send(frame)
                    for _ in range(pipelined):
                        ws.recv(timeout=120)
                    with sent.get_lock():
                        sent.value += pipelined
                    if pipelined > 1:
                        return
        except Exception as exc:  # an attacker's failure is reported, not raised
            print(f"attacker: {type(exc).__name__}: {exc}", flush=True)

    threads = [threading.Thread(target=one) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def start_attackers(url: str, hello: bytes, shape: str, connections: int, processes: int, pipelined: int):
    context = multiprocessing.get_context("spawn")  # no fork of a process holding llama.cpp threads
    stop, sent = context.Event(), context.Value("l", 0)
    per_process = [connections // processes + (i < connections % processes) for i in range(processes)]
    workers = [context.Process(target=_attack, args=(url, hello, shape, n, pipelined, stop, sent), daemon=True)
               for n in per_process if n]
    for worker in workers:
        worker.start()
    return workers, stop, sent


def honest_summary(results, wall_s: float) -> dict:
    from benchmarks.session_wave import percentiles

    round_trips = [sample[0] for result in results for sample in result.samples]
    summary = {f"{name}_ms": value * 1000 for name, value in percentiles(round_trips, (50, 99)).items()}
    summary["worst_ms"] = max(round_trips, default=0.0) * 1000
    summary["rounds"] = len(round_trips)
    summary["rounds_per_s"] = len(round_trips) / wall_s if wall_s else 0.0
    summary["errors"] = [result.error for result in results if result.error]
    summary["mismatches"] = sum(len(result.mismatches) for result in results)
    return summary


def run(target: Path, draft_path: Path, sessions: int, rounds: int, attackers: int, memory_connections: int,
        k: int = 4, max_tokens: int = 48) -> dict:
    from benchmarks.session_wave import (
        MIB, PROMPTS, Service, hello_for, reference_continuations, run_wave, wait_until_closed,
    )
    from local_draft.draft_model import DraftModel

    service = Service(target, "llamacpp", max_sessions=max(sessions + attackers, memory_connections), pinned=True)
    report: dict = {"sessions": sessions, "attackers": attackers, "memory_connections": memory_connections}
    try:
        tokenizer = DraftModel(draft_path, n_ctx=1024, n_threads=1)
        hello = encode(hello_for(tokenizer))
        prompts = [tokenizer.tokenize(text) for text in PROMPTS]
        references = reference_continuations(service.url, tokenizer, prompts, max_tokens)
        run_wave(service.url, draft_path, prompts, references, sessions, 4, k, max_tokens)  # warm-up
        wait_until_closed(service)

        results, wall = run_wave(service.url, draft_path, prompts, references, sessions, rounds, k, max_tokens)
        report["honest"] = honest_summary(results, wall)
        wait_until_closed(service)

        workers, stop, sent = start_attackers(service.url, hello, "stall", attackers, attackers, 1)
        deadline = time.monotonic() + 60
        while sent.value < attackers and time.monotonic() < deadline:  # connected and sending
            time.sleep(0.05)
        results, wall = run_wave(service.url, draft_path, prompts, references, sessions, rounds, k, max_tokens)
        stop.set()
        for worker in workers:
            worker.join(120)
        report["under_attack"] = honest_summary(results, wall)
        report["under_attack"]["attack_frames"] = sent.value
        wait_until_closed(service)

        time.sleep(1.0)
        before = service.rss()
        peak = [before]
        workers, stop, sent = start_attackers(service.url, hello, "sync", memory_connections, 4, PIPELINED)
        while any(worker.is_alive() for worker in workers):
            peak.append(service.rss())
            time.sleep(0.05)
        wait_until_closed(service)
        time.sleep(1.0)
        report["memory"] = {"frames": sent.value, "rss_before_mib": before / MIB, "rss_peak_mib": max(peak) / MIB,
                            "rss_after_mib": service.rss() / MIB}
    finally:
        service.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20, help="at least this many rounds per honest session")
    parser.add_argument("--attackers", type=int, default=4, help="connections sending the 1 MiB frame")
    parser.add_argument("--memory-connections", type=int, default=32,
                        help=f"connections each pipelining {PIPELINED} million-token Syncs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        from models.tiny import build_tiny_models

        tiny = build_tiny_models(Path(folder), seed=0)
        report = run(tiny.target_gguf, tiny.draft, args.sessions, args.rounds, args.attackers,
                     args.memory_connections)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)


def print_report(report: dict) -> None:
    print(f"{report['sessions']} honest sessions; {report['attackers']} attacking connections")
    print("honest round trip          p50 ms   p99 ms   worst ms   rounds/s   errors   mismatches")
    for name in ("honest", "under_attack"):
        row = report[name]
        print(f"  {name.replace('_', ' '):<22} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['worst_ms']:10.1f} "
              f"{row['rounds_per_s']:10.1f} {len(row['errors']):8d} {row['mismatches']:12d}")
    print(f"  attack frames answered: {report['under_attack']['attack_frames']}")
    memory = report["memory"]
    print(f"memory attack ({report['memory_connections']} connections x {PIPELINED} pipelined million-token Syncs, "
          f"{memory['frames']} answered): RSS before {memory['rss_before_mib']:.0f} MiB, peak "
          f"{memory['rss_peak_mib']:.0f} MiB, after {memory['rss_after_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
