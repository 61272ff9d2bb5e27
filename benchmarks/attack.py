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

Two shapes of issue 29 run one honest session (greedy, k = 4, its own drafter) quiet, then
beside the attack, and print its round trip p50 / p99 both ways and the service's memory
after (tiny models, or `--pair default`: the default pair, fetched by `specwire models fetch`):

    .venv/bin/python -m benchmarks.attack --shape sync-thrash [--attackers 4] [--pair default]
    .venv/bin/python -m benchmarks.attack --shape pool-churn [--attackers 2] [--churn-sessions 7]

- sync-thrash: each attacker alternates two histories of max-context - 1 tokens that share
  nothing, a Sync and a one-token Verify each, so that every round of its is a full prefill;
- pool-churn: each attacker opens --churn-sessions sessions (one round each, so that each
  holds a KV slot), closes them, and again: the service's KV pool grows and shrinks around them.
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


# ---- issue 29's shapes: one honest session beside Sync thrash or KV pool churn ----------------


def _thrash(url: str, hello: bytes, history: int, vocab_size: int, connections: int, stop, sent) -> None:
    """In its own process: connections alternating two `history`-token histories that share no token,
    each a Sync then a Verify that makes the service read the whole history again."""
    import random as _random

    from websockets.sync.client import connect

    from wire.protocol import Verify, decode_server_message

    def one(index: int) -> None:
        rng = _random.Random(index)
        histories = [[rng.randrange(1, vocab_size // 2) for _ in range(history)],
                     [rng.randrange(vocab_size // 2, vocab_size - 1) for _ in range(history)]]
        try:
            with connect(url, subprotocols=[SUBPROTOCOL], max_size=None, open_timeout=120) as ws:
                ws.send(hello)
                ws.recv(timeout=120)
                seq = 0
                while not stop.is_set():
                    for tokens in histories:
                        seq += 1
                        ws.send(encode(Sync(seq=seq, tokens=tokens)))
                        ws.recv(timeout=3600)
                        seq += 1
                        ws.send(encode(Verify(seq=seq, committed_len=len(tokens))))
                        # fed in pieces that take turns, a prefill of the 1.5B on a CPU takes minutes
                        reply = decode_server_message(ws.recv(timeout=3600))
                        if type(reply).__name__ != "Verdict":
                            print(f"thrash: {reply}", flush=True)
                            return
                        with sent.get_lock():
                            sent.value += 1
                        if stop.is_set():
                            return
        except Exception as exc:  # an attacker's failure is reported, not raised
            print(f"thrash attacker: {type(exc).__name__}: {exc}", flush=True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _churn(url: str, hello: bytes, sessions: int, connections: int, stop, sent) -> None:
    """In its own process: `connections` workers, each opening `sessions` sessions (one one-token round
    each, so that each holds a KV slot), closing them all, and again, as fast as the service lets it."""
    from websockets.sync.client import connect

    from wire.protocol import Verify

    def one() -> None:
        while not stop.is_set():
            opened = []
            try:
                for _ in range(sessions):
                    ws = connect(url, subprotocols=[SUBPROTOCOL], max_size=None, open_timeout=120)
                    opened.append(ws)
                    ws.send(hello)
                    ws.recv(timeout=120)
                    ws.send(encode(Verify(seq=1, committed_len=0, append=[1])))
                    ws.recv(timeout=120)
                with sent.get_lock():
                    sent.value += 1
            except Exception as exc:  # refused (a limit): back off a moment, as a client would
                print(f"churn attacker: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                time.sleep(0.5)
            finally:
                for ws in opened:
                    ws.close()

    threads = [threading.Thread(target=one) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def start_shape(target, args: tuple, processes: int = 1):
    """`target(*args, stop, sent)` in `processes` spawned processes; returns them, the stop event and the count."""
    context = multiprocessing.get_context("spawn")
    stop, sent = context.Event(), context.Value("l", 0)
    workers = [context.Process(target=target, args=(*args, stop, sent), daemon=True) for _ in range(processes)]
    for worker in workers:
        worker.start()
    return workers, stop, sent


def honest_rounds(url: str, draft_path: Path, prompts, references, rounds: int, k: int, max_tokens: int,
                  deadline_s: float) -> dict:
    """One honest session generating greedily until `rounds` rounds or `deadline_s`: its round trips."""
    from benchmarks.session_wave import TimedClient, hello_for, percentiles
    from local_draft.draft_model import DraftModel
    from local_draft.speculator import Speculator
    from wire.protocol import SamplingParams

    draft = DraftModel(draft_path, n_ctx=2048, n_threads=1)
    client = TimedClient(url, hello_for(draft), stall_timeout_s=600.0)
    mismatches, done, which = 0, 0, 0
    started = time.monotonic()
    try:
        speculator = Speculator(draft, client, SamplingParams(), k=k)
        while done < rounds and time.monotonic() - started < deadline_s:
            generation = speculator.generate(prompts[which % len(prompts)], max_tokens)
            mismatches += generation.token_ids != references[which % len(prompts)]
            done += generation.stats.rounds
            which += 1
    finally:
        client.close()
    trips = [sample[0] for sample in client.samples]
    summary = {f"{name}_ms": value * 1000 for name, value in percentiles(trips, (50, 99)).items()}
    # where a round trip went: waiting for the device (the service's fairness), and the rest (the
    # pass itself, the wire, this client's own turn on a busy machine)
    queued = [sample[1] for sample in client.samples]
    summary.update({f"queued_{name}_ms": value * 1000 for name, value in percentiles(queued, (50, 99)).items()})
    rest = [trip - wait - service for trip, wait, service in client.samples]
    summary.update({f"rest_{name}_ms": value * 1000 for name, value in percentiles(rest, (50, 99)).items()})
    summary.update(worst_ms=max(trips, default=0.0) * 1000, rounds=len(trips), mismatches=mismatches,
                   wall_s=time.monotonic() - started)
    return summary


def run_shape(shape: str, target: Path, draft_path: Path, attackers: int, rounds: int, churn_sessions: int = 7,
              k: int = 4, max_tokens: int = 32, deadline_s: float = 600.0, service_args: tuple[str, ...] = (),
              pinned: bool = True) -> dict:
    """The honest session quiet, then beside `attackers` of `shape`; the service's memory after."""
    from benchmarks.session_wave import MIB, PROMPTS, Service, hello_for, reference_continuations, wait_until_closed
    from local_draft.draft_model import DraftModel

    service = Service(target, "llamacpp", max_sessions=32, pinned=pinned, extra_args=service_args)
    report: dict = {"shape": shape, "attackers": attackers, "target": target.name, "pinned": pinned,
                    "service_args": list(service_args)}
    try:
        tokenizer = DraftModel(draft_path, n_ctx=2048, n_threads=1)
        hello = encode(hello_for(tokenizer))
        prompts = [tokenizer.tokenize(text) for text in PROMPTS[:4]]
        references = reference_continuations(service.url, tokenizer, prompts, max_tokens)
        honest_rounds(service.url, draft_path, prompts, references, 8, k, max_tokens, deadline_s)  # warm-up
        wait_until_closed(service)
        report["rss_before_mib"] = service.rss() / MIB
        report["quiet"] = honest_rounds(service.url, draft_path, prompts, references, rounds, k, max_tokens,
                                        deadline_s)
        if shape == "sync-thrash":
            history = int(_welcome_of(service.url, hello).max_context) - 1
            workers, stop, sent = start_shape(_thrash, (service.url, hello, history, tokenizer.vocab_size, attackers))
            report["history_tokens"] = history
        else:
            workers, stop, sent = start_shape(_churn, (service.url, hello, churn_sessions, attackers))
            report["churn_sessions"] = churn_sessions
        time.sleep(3.0)  # the attack under way
        peak = [service.rss()]
        watching = threading.Event()

        def watch() -> None:
            while not watching.wait(0.1):
                peak.append(service.rss())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        report["attacked"] = honest_rounds(service.url, draft_path, prompts, references, rounds, k, max_tokens,
                                           deadline_s)
        stop.set()
        watching.set()
        for worker in workers:
            worker.join(10)
            if worker.is_alive():  # waiting on a prefill of its own: it has done its part
                worker.terminate()
                worker.join(10)
        report["attack_cycles"] = sent.value
        report["rss_peak_mib"] = max(peak) / MIB
        wait_until_closed(service, 120)
        time.sleep(2.0)
        report["rss_after_mib"] = service.rss() / MIB
    finally:
        service.close()
    return report


def _welcome_of(url: str, hello: bytes):
    from websockets.sync.client import connect

    from wire.protocol import decode_server_message

    with connect(url, subprotocols=[SUBPROTOCOL], max_size=None) as ws:
        ws.send(hello)
        return decode_server_message(ws.recv(timeout=60))


def print_shape(report: dict) -> None:
    what = (f"{report['attackers']} Sync-thrashing clients ({report['history_tokens']}-token histories)"
            if report["shape"] == "sync-thrash" else
            f"{report['attackers']} churning clients ({report['churn_sessions']} sessions each, opened and closed)")
    where = "the service pinned to one CPU" if report["pinned"] else "nothing pinned (as the README starts it)"
    flags = f", serve {' '.join(report['service_args'])}" if report["service_args"] else ""
    print(f"{report['target']}: one honest session (k = 4) quiet, then beside {what}; {where}{flags}")
    print("honest round trip          p50 ms   p99 ms   worst ms   rounds   mismatches   queued p50 / p99 ms"
          "   outside the service p50 / p99 ms")
    for name in ("quiet", "attacked"):
        row = report[name]
        print(f"  {name:<22} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['worst_ms']:10.1f} {row['rounds']:8d} "
              f"{row['mismatches']:12d}   {row['queued_p50_ms']:.1f} / {row['queued_p99_ms']:.1f}"
              f"{'':17}{row['rest_p50_ms']:.1f} / {row['rest_p99_ms']:.1f}")
    print(f"  p99 under attack / quiet: {report['attacked']['p99_ms'] / max(report['quiet']['p99_ms'], 1e-9):.2f}x; "
          f"attack cycles completed: {report['attack_cycles']}")
    print(f"service memory: before {report['rss_before_mib']:.0f} MiB, peak {report['rss_peak_mib']:.0f} MiB, "
          f"after {report['rss_after_mib']:.0f} MiB")


def default_pair_paths() -> tuple[Path, Path]:
    """The default pair's target and draft GGUF files (`specwire models fetch` puts them there)."""
    from models.fetch import fetch_chunks
    from models.registry import QWEN_CODER, file_path

    target, draft = file_path(QWEN_CODER, QWEN_CODER.target), file_path(QWEN_CODER, QWEN_CODER.draft)
    fetch_chunks(QWEN_CODER.target.chunks, target)
    fetch_chunks(QWEN_CODER.draft.chunks, draft)
    return target, draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["frames", "sync-thrash", "pool-churn"], default="frames",
                        help="frames: the honest load beside the 1 MiB frames and the memory attack (default)")
    parser.add_argument("--pair", choices=["tiny", "default"], default="tiny",
                        help="sync-thrash and pool-churn: the tiny models or the default pair")
    parser.add_argument("--churn-sessions", type=int, default=7, help="pool-churn: sessions each attacker opens")
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="sync-thrash and pool-churn: the most seconds an honest run may take")
    parser.add_argument("--service-arg", action="append", default=[], dest="service_args",
                        help="a flag for `specwire serve` (repeat it)")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20, help="at least this many rounds per honest session")
    parser.add_argument("--attackers", type=int, default=4, help="connections sending the 1 MiB frame")
    parser.add_argument("--memory-connections", type=int, default=32,
                        help=f"connections each pipelining {PIPELINED} million-token Syncs")
    parser.add_argument("--pin", choices=["both", "one", "none"], default="both",
                        help="sync-thrash and pool-churn: the service pinned to one CPU (a steadier measure), "
                             "not pinned (as users start it), or both, one after the other (default)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.shape != "frames":
        with tempfile.TemporaryDirectory() as folder:
            if args.pair == "default":
                target, draft = default_pair_paths()
            else:
                from models.tiny import build_tiny_models

                tiny = build_tiny_models(Path(folder), seed=0)
                target, draft = tiny.target_gguf, tiny.draft
            pinnings = {"both": (True, False), "one": (True,), "none": (False,)}[args.pin]
            reports = [run_shape(args.shape, target, draft, args.attackers, args.rounds, args.churn_sessions,
                                 deadline_s=args.deadline, service_args=tuple(args.service_args), pinned=pinned)
                       for pinned in pinnings]
        if args.json:
            print(json.dumps(reports, indent=1))
        else:
            for report in reports:
                print_shape(report)
        return
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
