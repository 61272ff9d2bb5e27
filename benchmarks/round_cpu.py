"""CPU a sampled generation costs, client and service in one process: the statistical tests' paths.

    .venv/bin/python -m benchmarks.round_cpu [--seeds 2000] [--cases ahead,seeded,far,paced] [--json FILE]

The suite's statistical cases (tests/local_draft/test_sampling_exactness.py and
test_stream_sampling.py) draw tens of thousands of generations of the project's tiny models through
a real service (llama.cpp), each a few round trips: their CPU is most of the suite's. This runs
each case's loop, one process, a session re-keyed for every seed as the cases do
(tests/forked_seeds.py `reseeded_generations`), and reports the CPU (process time: the client, the
service's event loop and its device thread together) and wall time a generation takes:

- ahead: the close drafter, temperature 1, top-k 8, top-p 0.9, k = 2, drafting ahead, 5 tokens
  (`generate --mode rounds --k 2 --max-tokens 5 --seed`: the suite's seeded case);
- seeded: the same sampling, k = 3, no drafting ahead, 4 tokens;
- far: the far drafter, temperature 1, k = 1, 2 tokens (nearly every draft rejected);
- paced: the default mode's stream with guesses, 3 tokens, against a service whose passes are held
  to 12 ms (a GPU's pace; it sleeps, so wall is far above CPU), a sixth as many seeds.

Compare two versions side by side on one machine (this machine is shared and noisy): run each,
one after the other, twice. The first tokens of the first seeds are printed too: a change that
should not move a seeded generation must leave them as they were.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from local_draft.draft_model import DraftModel
from local_draft.speculator import Speculator
from local_draft.stream_speculator import StreamSpeculator
from models.tiny import build_tiny_models
from remote_verify.backends.llamacpp_backend import LlamaCppTarget
from tests.conftest import RunningService, hello_for, paced_running_service
from tests.forked_seeds import reseeded_generations
from wire.protocol import SamplingParams

CASES = ("ahead", "seeded", "far", "paced")
CLOSE = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
FAR = SamplingParams(temperature=1.0)
FIRST_SEED = 4_000_000
WARM_UP_SEEDS = 30
PACED_PASS_MS = 12.0  # tests/local_draft/test_stream_sampling.py PASS_MS


def _job(case: str, close: DraftModel, far: DraftModel, service, paced_service):
    """(the case's job for tests.forked_seeds, its generation's tokens)."""
    prompt = close.tokenize("The")
    if case == "ahead":
        return reseeded_generations(service, hello_for(close, CLOSE),
                                    lambda c: Speculator(close, c, CLOSE, k=2, pipeline=True), prompt, 5)
    if case == "seeded":
        return reseeded_generations(service, hello_for(close, CLOSE),
                                    lambda c: Speculator(close, c, CLOSE, k=3, pipeline=False), prompt, 4)
    if case == "far":
        return reseeded_generations(service, hello_for(far, FAR, seed=1234),
                                    lambda c: Speculator(far, c, FAR, k=1, seed=1234, pipeline=False), prompt, 2)
    return reseeded_generations(paced_service, hello_for(close, CLOSE, seed=1),
                                lambda c: StreamSpeculator(close, c, CLOSE, seed=1, max_block=4, colocated=False),
                                prompt, 3)


def run(seeds: int, cases: list[str]) -> list[dict]:
    tiny = build_tiny_models(Path(tempfile.mkdtemp(prefix="specwire-round-cpu-")), seed=0)
    close = DraftModel(tiny.draft, n_ctx=2048, n_threads=1)
    far = DraftModel(tiny.draft_far, n_ctx=2048, n_threads=1)
    service = RunningService(LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1))
    paced = paced_running_service(tiny, PACED_PASS_MS) if "paced" in cases else None
    rows = []
    try:
        for case in cases:
            job = _job(case, close, far, service, paced)
            count = seeds // 6 if case == "paced" else seeds
            job(range(WARM_UP_SEEDS))
            wall0, cpu0 = time.perf_counter(), time.process_time()
            made = job(range(FIRST_SEED, FIRST_SEED + count))
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            rows.append({"case": case, "generations": count, "cpu_ms": round(cpu / count * 1e3, 3),
                         "wall_ms": round(wall / count * 1e3, 3),
                         "first_tokens": [g.token_ids for g in made[:3]]})
            print(f"{case:7s} {count:6d} generations: CPU {rows[-1]['cpu_ms']:6.2f} ms, "
                  f"wall {rows[-1]['wall_ms']:6.2f} ms a generation; first tokens {rows[-1]['first_tokens']}",
                  flush=True)
    finally:
        service.close()
        if paced is not None:
            paced.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2000, help="generations a case (paced: a sixth)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    cases = [case for case in args.cases.split(",") if case]
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)}: choose from {', '.join(CASES)}")
    rows = run(args.seeds, cases)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
