"""Does seeded sampling shift mass off the likeliest token? Issue 32's experiment, by path.

    .venv/bin/python -m benchmarks.seeded_shift [--path cli|library|replay] [--seeds 1-12000]
        [--random-seeds N | --unseeded N] [--mode rounds|hybrid] [--k 3] [--pipeline] [--jobs 2]
        [--same-as PATH] [--models DIR] [--save FILE] [--blocks SIZE]

The experiment: the project's tiny models (`specwire models tiny`, or --models DIR), the target
served by `specwire serve --backend torch`, the close drafter, prompt "The", temperature 1,
top-k 8, top-p 0.9, `--mode rounds --k 3 --no-pipeline --max-tokens 4`, one generation per
seed, and the first generated token counted. With --mode hybrid, the command's default mode
(the service streams and verifies guesses as they arrive), as a user runs it: no mode flag. The reference is the target's own warped distribution for the
prompt's tokens (the drafter's tokenization, BOS as its vocabulary asks): `TorchTarget.forward`
then `wire.sampling.warp` with the same parameters.

Paths (--path):
- cli: one `specwire generate ... --seed S --json` process per seed, --jobs at a time, as a
  user runs it.
- library: in this process, per seed a ServiceLink with the command's Hello and a Speculator
  (hybrid: a StreamSpeculator) seeded alike: the code the command runs, without a process.
- replay: no service and no generation. With a seed, the first token is a function of the
  seed, the drafter's q and the target's p for the prompt: the drafter's first draw from q
  (`draft_generator`), then the service's decision about it (`accept_sampled` with the
  session's draws, `DecisionRandomness`), or with --k 0 the service's own draw from p; in
  hybrid mode the target's race over the seed's clocks (`race_choice`, `race`). The
  replay runs that same code at a thousandth of the cost, for seed sets no CLI run can
  afford; `--same-as cli` (or library) runs the other path on the same seeds and counts the
  seeds whose first token differs.

Seeds: a range (--seeds A-B, the issue's 1-12000 by default), N random 63-bit seeds
(--random-seeds N), or N generations with no seed at all (--unseeded N: fresh entropy on
both ends, as `generate` without --seed).

The table has the issue's rows for a set of n seeds (its first sixth, first half, second
half, and all of it): the likeliest token's observed frequency, the target's, the difference
in points and its z, the chi-square p over the support (tests/statistics.py, the statistic
the exactness tests use), and each statistic's power at that n: the shift of mass off the
likeliest token (onto the second) that it detects 90% of the time at the tests' ALPHA (the
z-test two-sided: (z_{1-ALPHA/2} + z_{0.9}) * sqrt(p (1 - p) / n); the chi-square's by
simulation, `detectable_shift`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from tests.statistics import ALPHA, chi_square_pvalue, detectable_shift
from wire.protocol import SamplingParams

PROMPT = "The"
PARAMS = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
MAX_TOKENS = 4
SPECWIRE = str(Path(sys.executable).parent / "specwire")
Run = Callable[[int | None], list[int]]  # a seed (None: unseeded) -> the generated token ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default="cli", choices=["cli", "library", "replay"])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seeds", default="1-12000", help="a range of seeds, A-B inclusive (default: %(default)s)")
    which.add_argument("--random-seeds", type=int, metavar="N", help="N random 63-bit seeds")
    which.add_argument("--unseeded", type=int, metavar="N", help="N generations without --seed")
    parser.add_argument("--mode", default="rounds", choices=["rounds", "hybrid"],
                        help="rounds: issue 32's round-based command (default); hybrid: the command's default "
                             "mode, which streams (--k and --pipeline do not apply)")
    parser.add_argument("--k", type=int, default=3, help="rounds: draft tokens per round (default: %(default)s)")
    parser.add_argument("--pipeline", action="store_true", help="rounds: draft ahead (default: --no-pipeline)")
    parser.add_argument("--jobs", type=int, default=2, help="cli: generate processes at once (default: %(default)s)")
    parser.add_argument("--same-as", choices=["cli", "library", "replay"],
                        help="run this path on the same seeds too and count the seeds whose first token differs")
    parser.add_argument("--models", type=Path,
                        help="tiny models made by `specwire models tiny DIR` (default: made now)")
    parser.add_argument("--save", type=Path, help="write {seed: token ids} of every run here (JSON)")
    parser.add_argument("--blocks", type=int, metavar="SIZE",
                        help="also split the run into blocks of SIZE seeds and summarise the likeliest token's z "
                             "across them (independent samples: mean 0, standard deviation 1)")
    args = parser.parse_args()
    if args.unseeded and args.same_as:
        parser.error("--same-as compares seeded runs: unseeded ones cannot be repeated")

    with tempfile.TemporaryDirectory() as scratch:
        models = args.models or make_tiny_models(Path(scratch) / "tiny")
        seeds = seed_list(args)
        experiment = Experiment(models, args.mode, args.k, args.pipeline, Path(scratch))
        rounds = f"--k {args.k} {'--pipeline' if args.pipeline else '--no-pipeline'}, "
        print(f"# {len(seeds)} {describe(args)}, --mode {args.mode}, {rounds if args.mode == 'rounds' else ''}"
              f"max tokens {MAX_TOKENS}, prompt {PROMPT!r}, {PARAMS}")
        print(f"# the target's p for the prompt's tokens {experiment.prompt}: "
              + ", ".join(f"{int(t)}: {experiment.p[t]:.4f}" for t in np.flatnonzero(experiment.p)))
        try:
            started = time.perf_counter()
            firsts = run_path(experiment, args.path, seeds, args.jobs, args.save)
            print(f"# {args.path}: {len(seeds)} generations in {time.perf_counter() - started:.0f} s")
            print_table(experiment.p, seeds, firsts, args.path, ranged=not (args.unseeded or args.random_seeds))
            if args.blocks:
                print_blocks(experiment.p, seeds, firsts, args.blocks)
            if args.same_as:
                other = run_path(experiment, args.same_as, seeds, args.jobs, None)
                differ = [seed for seed, a, b in zip(seeds, firsts, other) if a != b]
                print(f"# {args.path} against {args.same_as}: the first token differs for {len(differ)} of "
                      f"{len(seeds)} seeds" + (f" (the first: {differ[:10]})" if differ else ""))
        finally:
            experiment.close()


def describe(args: argparse.Namespace) -> str:
    if args.unseeded:
        return "generations without a seed"
    if args.random_seeds:
        return "random 63-bit seeds"
    return f"seeds {args.seeds}"


def seed_list(args: argparse.Namespace) -> list[int | None]:
    if args.unseeded:
        return [None] * args.unseeded
    if args.random_seeds:
        return [int(seed) for seed in np.random.default_rng().integers(0, 2**63, size=args.random_seeds)]
    first, last = (int(part) for part in args.seeds.split("-"))
    return list(range(first, last + 1))


def make_tiny_models(out: Path) -> Path:
    done = subprocess.run([SPECWIRE, "models", "tiny", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr)
    return out


class Experiment:
    """The served target, the drafter, the reference p and the drafter's q for the prompt."""

    def __init__(self, models: Path, mode: str, k: int, pipeline: bool, scratch: Path):
        from local_draft.draft_model import DraftModel
        from remote_verify.backends.torch_backend import TorchTarget
        from wire.sampling import warp

        self.models, self.mode, self.k, self.pipeline = models, mode, k, pipeline
        self.draft = DraftModel(models / "draft.gguf")  # as `generate` loads it
        self.prompt = self.draft.tokenize(PROMPT)
        target = TorchTarget(models / "target", device="cpu")
        self.p = warp(target.forward(target.new_cache(), self.prompt, 1)[0], PARAMS)  # (V,)
        _, [self.q] = self.draft.propose(self.prompt, 1, PARAMS, np.random.default_rng(0))  # what the drafter sends
        # the command's adaptive-k memory goes to a file of this run's, not the user's
        self.env = {**os.environ, "SPECWIRE_ADAPTIVE_STATE": str(scratch / "adaptive-k.json")}
        self.service: subprocess.Popen | None = None
        self.url = ""

    def serve(self) -> str:
        if self.service is None:
            self.service = subprocess.Popen(
                [SPECWIRE, "serve", "--target", str(self.models / "target"), "--backend", "torch", "--port", "0",
                 "--exit-with-parent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=self.env)
            line = self.service.stdout.readline()
            if not line.startswith("listening on "):
                sys.exit(f"the service did not start: {line!r}")
            self.url = line.split()[-1]
        return self.url

    def close(self) -> None:
        if self.service is not None:
            self.service.kill()
            self.service.wait()

    def cli(self, seed: int | None) -> list[int]:
        command = [SPECWIRE, "generate", "--server", self.serve(), "--draft", str(self.models / "draft.gguf"),
                   "--prompt", PROMPT, "--temperature", str(PARAMS.temperature), "--top-k", str(PARAMS.top_k),
                   "--top-p", str(PARAMS.top_p), "--max-tokens", str(MAX_TOKENS), "--json"]
        if self.mode == "rounds":  # hybrid is the command's default: no mode flag, as a user runs it
            command += ["--mode", "rounds", "--k", str(self.k)] + ([] if self.pipeline else ["--no-pipeline"])
        command += [] if seed is None else ["--seed", str(seed)]
        done = subprocess.run(command, capture_output=True, text=True, env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"generate --seed {seed} failed: {done.stderr}")
        return json.loads(done.stdout)["token_ids"]

    def library(self, seed: int | None) -> list[int]:
        from local_draft.service_link import ServiceLink
        from local_draft.speculator import Speculator

        from local_draft.stream_speculator import StreamSpeculator
        from wire.randomness import fresh_seed

        if self.mode == "hybrid":  # the command makes a seed when none is given: the drafter's guesses need it
            seed = fresh_seed() if seed is None else seed
        link = ServiceLink(self.serve(), self.draft.hello(PARAMS, seed=seed, client="specwire generate"))
        try:
            if self.mode == "hybrid":
                speculator = StreamSpeculator(self.draft, link, PARAMS, seed=seed, end_ids=self.draft.end_ids)
            else:
                speculator = Speculator(self.draft, link, PARAMS, k=self.k, seed=seed, pipeline=self.pipeline,
                                        end_ids=self.draft.end_ids)
            return speculator.generate(self.prompt, MAX_TOKENS).token_ids
        finally:
            link.close()

    def replay(self, seed: int | None) -> list[int]:
        """The first token alone, from the seed, p and q (see the module's docstring)."""
        from remote_verify.acceptance import accept_sampled
        from wire.randomness import DecisionRandomness, draft_generator
        from wire.sampling import race_choice, sample

        randomness = DecisionRandomness(seed)  # the service's draws for this seed
        start = len(self.prompt)  # the absolute position of the first generated token
        if self.mode == "hybrid":  # the target's race over its clocks there; guesses decide no token
            return [race_choice(self.p, randomness.race(start, self.p.shape[0]))]

        def draw(i, what):
            return randomness.at(start + i, what)

        if self.k == 0:  # the service's own token
            _, token = accept_sampled(self.p[None], [], [], draw)
            return [token]
        drafted = sample(self.q, draft_generator(seed))  # the drafter's first draw
        accepted, token = accept_sampled(np.stack([self.p, self.p]), [drafted], [self.q], draw)
        return [drafted if accepted else token]  # accepted: the drafted token comes first


def run_path(experiment: Experiment, path: str, seeds: Sequence[int | None], jobs: int,
             save: Path | None) -> list[int]:
    """Every seed's first generated token on `path`."""
    run: Run = getattr(experiment, path)
    if path != "replay":
        experiment.serve()  # before the workers: they share one service
    done: list[list[int]] = []
    with ThreadPoolExecutor(jobs) as pool:  # processes run side by side; this process's paths, one at a time
        for i, tokens in enumerate(pool.map(run, seeds) if path == "cli" else map(run, seeds), start=1):
            done.append(tokens)
            if path != "replay" and i % 500 == 0:
                print(f"  {path}: {i} of {len(seeds)}", file=sys.stderr, flush=True)
    if save is not None:
        save.write_text(json.dumps({"path": path, "mode": experiment.mode, "k": experiment.k, "pipeline": experiment.pipeline,
                                    "seeds": list(seeds), "tokens": done}))
    return [tokens[0] for tokens in done]


def print_table(p: np.ndarray, seeds: Sequence[int | None], firsts: Sequence[int], path: str, ranged: bool) -> None:
    from scipy import stats

    n_all = len(firsts)
    likeliest = int(np.argmax(p))
    z_power = stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(0.9)
    rows = [(0, n_all // 6), (0, n_all // 2), (n_all // 2, n_all), (0, n_all)]
    print(f"\n| {path}: seeds | n | likeliest token ({likeliest}) | target | points | z | chi-square p "
          f"| power: z | power: chi-square |")
    print("|---|---|---|---|---|---|---|---|---|")
    for first, last in rows:
        if last <= first:
            continue
        part = np.asarray(firsts[first:last])
        n = part.size
        counts = np.bincount(part, minlength=p.size)
        observed = counts[likeliest] / n
        sd = np.sqrt(p[likeliest] * (1 - p[likeliest]) / n)
        label = f"{seeds[first]} .. {seeds[last - 1]}" if ranged else f"runs {first + 1} .. {last}"
        print(f"| {label} | {n:,} | {observed:.4f} | {p[likeliest]:.4f} | {100 * (observed - p[likeliest]):+.2f} "
              f"| {(observed - p[likeliest]) / sd:+.2f} | {chi_square_pvalue(counts, p):.3f} "
              f"| {100 * z_power * sd:.2f} | {100 * detectable_shift(p, n):.2f} |")


def print_blocks(p: np.ndarray, seeds: Sequence[int | None], firsts: Sequence[int], size: int) -> None:
    """The likeliest token's z in each block of `size` consecutive runs: how far the first block
    stands from the others (a property of its seeds if it stands alone)."""
    likeliest = int(np.argmax(p))
    hits = np.asarray(firsts[: len(firsts) // size * size]).reshape(-1, size) == likeliest  # (blocks, size)
    z = (hits.mean(axis=1) - p[likeliest]) / np.sqrt(p[likeliest] * (1 - p[likeliest]) / size)  # (blocks,)
    if z.size < 2:
        print(f"# --blocks {size}: fewer than two blocks in {len(firsts)} runs")
        return
    from scipy import stats

    critical = stats.norm.ppf(1 - ALPHA / 2)
    print(f"\n# {z.size} blocks of {size:,} runs: the likeliest token's z has mean {z.mean():+.2f} and standard "
          f"deviation {z.std(ddof=1):.2f}; |z| > {critical:.2f} (p < {ALPHA}) in {int((np.abs(z) > critical).sum())}; "
          f"the first block (from seed {seeds[0]}): z {z[0]:+.2f}, rank {int((np.abs(z) >= abs(z[0])).sum())} "
          f"of {z.size} by |z|; the smallest z {z.min():+.2f}, the largest {z.max():+.2f}")


if __name__ == "__main__":
    main()
