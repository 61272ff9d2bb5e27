"""Contention: the drafter and a service on one machine, with 0, 1 and 2 busy processes beside them.

    .venv/bin/python -m benchmarks.contention [--models tiny|default] [--busy 0,1,2] [--max-tokens 64]

Two thread settings side by side, each in fresh processes (OpenMP reads its wait policy
when llama.cpp loads, so a setting cannot change within one process):
- `plan`: what specwire does by default (wire/threads.py): the drafter on 1 thread, the
  service's one-token steps on the physical cores the drafter leaves and its blocks on
  every physical core, OpenMP threads sleeping while they wait;
- `all cores`: what it did before: both on every logical CPU, OpenMP's default wait (spin,
  then sleep). Its OMP_WAIT_POLICY is set to an empty value, which libgomp reports as invalid
  and then ignores, so that specwire's own PASSIVE default does not apply.
For each setting and number of busy loops (`python3 -c "while True: pass"`) it measures the
drafter's milliseconds per drafted token (greedy, after a warm-up, median of 5 blocks) and
`specwire generate` end to end (default mode: adaptive k, drafting ahead) against a service
started for it: tokens/s and time to first token. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "def quicksort(arr):"
BUSY_LOOP = "while True: pass"
PROBE_BLOCK = 16  # tokens per timed drafting block
PROBE_BLOCKS = 5


def settings() -> dict[str, dict]:
    """name -> {"draft": drafter threads, "service": serve's thread flags, "env": environment overrides}."""
    from app.threads_flags import colocated_serve_flags
    from wire.threads import DRAFT_THREADS, usable_cpus

    logical = len(usable_cpus())
    return {
        "plan": {"draft": DRAFT_THREADS, "service": colocated_serve_flags(DRAFT_THREADS),
                 "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
        "all cores": {"draft": logical, "service": ["--threads", str(logical)], "env": {"OMP_WAIT_POLICY": ""}},
    }


def probe_drafter(draft: str, threads: int) -> None:
    """In a child process: print the drafter's median ms per drafted token as JSON."""
    from local_draft.draft_model import DraftModel
    from wire.protocol import SamplingParams
    import numpy as np

    model = DraftModel(draft, n_ctx=512, n_threads=threads)
    context = model.tokenize(PROMPT)
    rng = np.random.default_rng(0)
    model.propose(context, PROBE_BLOCK, SamplingParams(), rng)  # warm-up: buffers, the prompt
    times = []
    for _ in range(PROBE_BLOCKS):
        model.rollback(len(context) - 1)
        started = time.perf_counter()
        model.propose(context, PROBE_BLOCK, SamplingParams(), rng)
        times.append((time.perf_counter() - started) / PROBE_BLOCK * 1000)
    print(json.dumps({"ms_per_token": statistics.median(times)}))


def child_env(overrides: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, **overrides)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    # every run learns adaptive k from scratch, as a first run does: a file of its own
    env["SPECWIRE_ADAPTIVE_STATE"] = tempfile.mktemp(prefix="specwire-contention-", suffix=".json")
    return env


def drafter_ms(draft: str, setting: dict) -> float:
    done = subprocess.run([sys.executable, "-m", "benchmarks.contention", "--probe", draft, str(setting["draft"])],
                          env=child_env(setting["env"]), capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.splitlines()[-1])["ms_per_token"]


def end_to_end(draft: str, target: str, setting: dict, max_tokens: int) -> dict:
    """A service and one `generate` with this setting: tokens/s and time to first token."""
    env = child_env(setting["env"])
    service = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--target", target, "--backend", "llamacpp",
                                "--port", "0", *setting["service"]],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = service.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit("the service did not start")
        done = subprocess.run([sys.executable, "-m", "app.cli", "generate", "--draft", draft, "--server",
                               line.split()[-1], "--prompt", PROMPT, "--max-tokens", str(max_tokens), "--json",
                               "--draft-threads", str(setting["draft"])],
                              env=env, capture_output=True, text=True, timeout=600, check=True)
    finally:
        service.terminate()
        service.wait(timeout=60)
    stats = json.loads(done.stdout)["stats"]
    return {"tokens_per_s": stats["tokens_per_s"], "first_token_s": stats["first_token_s"]}


def models(which: str) -> tuple[str, str]:
    """(draft GGUF, target GGUF)."""
    if which == "default":
        from models.registry import get_pair, require_file

        pair = get_pair()
        return str(require_file(pair, pair.draft)), str(require_file(pair, pair.target))
    out = Path(tempfile.mkdtemp(prefix="specwire-contention-"))
    subprocess.run([sys.executable, "-m", "app.cli", "models", "tiny", str(out)], check=True,
                   stdout=subprocess.DEVNULL, env=child_env({}))
    return str(out / "draft.gguf"), str(out / "target.gguf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", choices=["tiny", "default"], default="tiny")
    parser.add_argument("--busy", default="0,1,2", help="busy-loop processes beside them (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--probe", nargs=2, metavar=("DRAFT", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe_drafter(args.probe[0], int(args.probe[1]))
        return
    draft, target = models(args.models)
    plans = settings()
    print(f"models: {args.models}; " + "; ".join(f"{name}: drafter {s['draft']} thread(s), service {s['service']}"
                                              for name, s in plans.items()))
    print("| busy loops | setting | drafter ms/token | end to end tokens/s | first token s |")
    print("|---|---|---|---|---|")
    for busy in [int(x) for x in args.busy.split(",")]:
        loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
        try:
            for name, setting in plans.items():
                ms = drafter_ms(draft, setting)
                run = end_to_end(draft, target, setting, args.max_tokens)
                print(f"| {busy} | {name} | {ms:.2f} | {run['tokens_per_s']:.1f} | {run['first_token_s']:.3f} |",
                      flush=True)
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()


if __name__ == "__main__":
    main()
