"""Sampling through the real protocol is distributed exactly as the target alone.

The reference is exact, not sampled: the target's joint distribution of the first tokens,
computed from its warped logits. Speculative samples of those tokens must fit it by a
chi-square test (tests/statistics.py sets the sample size and threshold; the power to catch
a 1% shift is measured in tests/remote_verify/test_acceptance.py), for a drafter that is
nearly always rejected (residual resampling, most of the target's mass outside the draft's
support) and one that is mostly accepted (top-k/top-p), with the loop drafting ahead while
verdicts are in flight (the fourth token then usually comes from a block drafted before the
first verdict arrived).

Every generation has its own seed, which keys both the drafter's draws and the service's
(wire/randomness.py): with one seed for all, the service would decide position n with the same
numbers every time. Each case has its own range of seeds, so that no two cases decide their
first tokens with the same numbers (their verdicts would fail or pass together).

Each large case costs tens of thousands of generations (minutes on two cores). The close drafter, which takes
every path of the acceptance rule (acceptance at two positions, corrections, a whole block with its
bonus), runs as `specwire generate --mode rounds --seed S` runs it, drafting ahead (the seeded case
below); the far drafter (rejections and residual resampling, three requests per generation) runs
too. The two run on llama.cpp, the backend `specwire serve` picks on a CPU, where a round-based
generation of the tiny models costs 4.5 ms of CPU (5.7 on ONNX Runtime, 9.0 on torch, whose eager
forward is mostly Python); ONNX Runtime has the smaller case below, adaptive k with drafting ahead
and a reconnect, the path those two leave out. The acceptance rule is the same code on every
backend; what a backend adds (its logits, its cache rollback) is checked token by token by the
parity tests and against recomputation by the session tests. A case's seeds are split over one
process per core (tests/forked_seeds.py).

Each case states its power, computed with tests/statistics.py's `detectable_shift` against its
exact distribution at its sample size: the shift of mass between its two likeliest outcomes that
it detects 90% of the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from local_draft.service_link import ServiceLink
from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from wire.protocol import SamplingParams
from wire.sampling import warp
from tests.conftest import hello_for
from tests.forked_seeds import map_seeds, reseeded_generations, service_here
from tests.statistics import ALPHA, SAMPLES, chi_square_pvalue, detectable_shift

PROMPT_TEXT = "The"
SPECWIRE = str(Path(sys.executable).parent / "specwire")


def _exact_first(backend, prompt: list[int], params: SamplingParams, n: int) -> dict[tuple, float]:
    """Joint target distribution of the first n generated tokens: {(t1, .., tn): probability}.

    A generation ends at EOS, so a prefix ending in EOS keeps its mass unextended.
    """
    joint = {(): 1.0}
    for _ in range(n):
        longer = {}
        for prefix, mass in joint.items():
            if prefix and prefix[-1] == backend.eos_id:
                longer[prefix] = mass
                continue
            probs = warp(backend.forward(backend.new_cache(), prompt + list(prefix), n_logits=1)[0], params)
            for token in np.flatnonzero(probs):
                longer[prefix + (int(token),)] = mass * probs[token]
        joint = longer
    return joint


class Tally:
    """Counts of the first n_tokens of each generation against the target's exact joint distribution."""

    def __init__(self, service, draft, params: SamplingParams, n_tokens: int, prompt: list[int] | None = None):
        self.prompt = draft.tokenize(PROMPT_TEXT) if prompt is None else prompt
        joint = _exact_first(service.backend, self.prompt, params, n_tokens)
        self.cells = {tokens: i for i, tokens in enumerate(joint)}  # one more cell: outside the support
        self.exact = np.append(np.array(list(joint.values())), 0.0)
        self.counts = np.zeros_like(self.exact, dtype=np.int64)
        self.n_tokens = n_tokens
        self.accepted = self.drafted = self.ahead_used = 0

    def add(self, result) -> None:
        self.counts[self.cells.get(tuple(result.token_ids[: self.n_tokens]), len(self.cells))] += 1
        self.accepted += result.stats.accepted
        self.drafted += result.stats.drafted
        self.ahead_used += result.stats.ahead_used

    def pvalue(self) -> float:
        return chi_square_pvalue(self.counts, self.exact)


# Nearly every draft rejected: the far drafter at temperature 0.7 and top-k 16, k = 1. Target and
# drafter keep different top 16s, so ~96% of the target's first-token mass is on tokens the draft
# never proposes: only the residual norm(max(0, p - q)) over the whole vocabulary brings it back (a
# residual cut to the draft's support would drop it). Two tokens: a residual draw, then a round
# after a rejection.
OUTSIDE_SUPPORT = SamplingParams(temperature=0.7, top_k=16)
# The power the two cases it replaces stated (the far drafter with no truncation, 1.1 points between
# the two likeliest pairs at 30,000 seeds; the draft's support, 1.9 at 6,000) takes 22,000 seeds here.
FAR_SAMPLES = 22_000
FAR_SEEDS = range(6_000_000, 6_000_000 + FAR_SAMPLES)  # the case's own range of seeds
FAR_POWER = 0.011  # detectable_shift at FAR_SAMPLES: 1.1 points between the two likeliest pairs, 90% of the time


def test_far_drafter_samples_follow_the_target_distribution(service_on, far_draft):
    """The first two tokens of FAR_SAMPLES generations whose drafts are nearly all rejected, and whose
    target mass lies mostly outside the draft's support, fit the target's exact joint distribution."""
    service = service_on("llamacpp")
    tally = Tally(service, far_draft, OUTSIDE_SUPPORT, 2)
    assert detectable_shift(tally.exact, FAR_SAMPLES) <= FAR_POWER
    _, [q] = far_draft.propose(tally.prompt, 1, OUTSIDE_SUPPORT, np.random.default_rng(0))  # what is sent
    p = warp(service.backend.forward(service.backend.new_cache(), tally.prompt, n_logits=1)[0], OUTSIDE_SUPPORT)
    assert np.delete(p, q.ids).sum() > 0.5  # the case is what it claims to be

    generations = reseeded_generations(
        service, hello_for(far_draft, OUTSIDE_SUPPORT, seed=1234),
        lambda client: Speculator(far_draft, client, OUTSIDE_SUPPORT, k=1, seed=1234, pipeline=False),
        tally.prompt, 2)
    for result in map_seeds(generations, FAR_SEEDS):
        tally.add(result)
    assert tally.pvalue() > ALPHA
    assert tally.accepted / tally.drafted < 0.05, tally.accepted / tally.drafted  # the rejection path was taken


# Adaptive k, drafting ahead, and a new connection after the first round of every generation
# (the client closes its socket, the link opens a new session, and the loop rebuilds it from the
# history and re-keys it), at temperature 0.7, top-k 8, top-p 0.9. The loop is new for each
# generation, so its k is the controller's before any measurement (START_K, capped at max_k = 2 and
# by the tokens left): round 1 drafts tokens 1-2 and decides 3, and token 4 usually comes from
# the block drafted after the guessed token 3 while the first verdict was in flight.
ADAPTIVE = SamplingParams(temperature=0.7, top_k=8, top_p=0.9)
ADAPTIVE_SAMPLES = 8_000  # power: a 2.6-point shift of mass between the two likeliest outcomes, 90% of the time


def test_adaptive_k_drafting_ahead_and_reconnecting_follow_the_target(service_on, close_draft):
    """k chosen by the controller, blocks drafted while verdicts fly, a reconnect after the first
    round: the first four tokens still fit the target's joint distribution."""
    service = service_on("onnx")
    tally = Tally(service, close_draft, ADAPTIVE, 4)

    def generations(seeds: range) -> list:
        with service_here(service) as url:
            link = ServiceLink(url, hello_for(close_draft, ADAPTIVE))
            rounds = 0

            def reconnect_after_the_first_round(tokens: list[int], provenance: list[str]) -> None:
                nonlocal rounds
                rounds += 1
                if rounds == 1:
                    link.current().close()  # the next round finds it closed and opens a new session

            made = []
            for seed in seeds:
                speculator = Speculator(close_draft, link, ADAPTIVE, k=None, pipeline=True, max_k=2)
                speculator.reseed(seed)
                rounds = 0
                before = link.connections
                made.append((speculator.generate(tally.prompt, 5, reconnect_after_the_first_round),
                             link.connections - before))
            link.close()
        return made

    reconnects = 0
    for result, opened in map_seeds(generations, range(3_000_000, 3_000_000 + ADAPTIVE_SAMPLES)):
        tally.add(result)
        reconnects += opened
    assert tally.pvalue() > ALPHA
    assert reconnects > 0.9 * ADAPTIVE_SAMPLES  # nearly every generation went on on a new session
    assert tally.ahead_used > 0.3 * ADAPTIVE_SAMPLES, tally.ahead_used


# The seeded round-based path, issue 32's experiment, drafting ahead: `specwire generate --mode rounds
# --prompt The --temperature 1 --top-k 8 --top-p 0.9 --k 2 --max-tokens 5 --seed S`, the close drafter
# on llama.cpp (the default mode, which streams, has its seeded case in test_stream_sampling.py). The
# command opens a session whose Hello carries S and seeds its Speculator with S (app/generate_command.py);
# here one session is re-keyed for each seed by a Sync (`Speculator.reseed`), which keys both ends the
# same way, so that SAMPLES seeds fit in a test run (a process per seed costs ~100 times more). That
# the two make the same tokens is checked through the command itself, seed for seed, by
# test_the_seeded_command_makes_what_a_reseeded_session_makes (the first round's tokens: drafting
# ahead, a seed fixes the rest only with `--no-pipeline`, which that test checks too).
#
# Tokens 1-2 are drafted (acceptance at two positions), 3 is the service's (a correction or the
# bonus, drawn from the target's distribution after both drafted tokens), and 4 usually comes from a
# block drafted while the first verdict was in flight (one more token is generated, so that a round
# drafted ahead decides it). Four statistics: the first token alone (issue 32's: its likeliest token
# came 1.6 points short over seeds 1-12,000, which a test of 3,000 seeds could not see;
# benchmarks/seeded_shift.py shows those seeds' draws, not the code, put it there), the first two
# tokens jointly, the first three (a whole block with its bonus: the close drafter has both drafts of
# nearly every first round accepted), and the first four.
SEEDED = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
SEEDED_K, SEEDED_MAX_TOKENS = 2, 5
SEEDED_SEEDS = range(4_000_000, 4_000_000 + SAMPLES)
# power (detectable_shift at SAMPLES, asserted below), 90% of the time: the first token, 1.0 point of
# mass off the likeliest token (p = 0.567) onto the next (0.193); the first two tokens, 0.8 points
# between the two likeliest pairs; the first three, 1.4 points between the two likeliest runs; the
# first four, 1.3 points
SEEDED_POWER = {1: 0.010, 2: 0.008, 3: 0.014, 4: 0.013}
SEEDED_CLI_SEEDS = 16  # seeds run through `specwire generate` itself
SEEDED_CLI_WHOLE_SEEDS = 6  # of those, run again with `--no-pipeline`: the whole reply compared
SEEDED_BACKEND = "llamacpp"


def _seeded_speculator(url: str, draft) -> tuple[VerifyClient, Speculator]:
    """One session for many seeds, as the seeded case re-keys it (`reseed` before each generation)."""
    client = VerifyClient(url, hello_for(draft, SEEDED))
    return client, Speculator(draft, client, SEEDED, k=SEEDED_K, pipeline=True)


def test_seeded_generations_follow_the_target(service_on, close_draft):
    """SAMPLES generations as `generate --mode rounds --seed S --k 2 --max-tokens 5` makes them, one
    seed each, drafting ahead: the first token, and the first two, three and four jointly, fit the
    target's exact distributions."""
    service = service_on(SEEDED_BACKEND)
    tallies = {n: Tally(service, close_draft, SEEDED, n) for n in SEEDED_POWER}
    for n, power in SEEDED_POWER.items():  # the power each statistic claims
        assert detectable_shift(tallies[n].exact, SAMPLES) <= power, n

    generations = reseeded_generations(
        service, hello_for(close_draft, SEEDED),
        lambda client: Speculator(close_draft, client, SEEDED, k=SEEDED_K, pipeline=True), tallies[1].prompt, SEEDED_MAX_TOKENS)
    bonus = 0  # rounds that kept both drafted tokens: the service drew the bonus
    for result in map_seeds(generations, SEEDED_SEEDS):
        for tally in tallies.values():
            tally.add(result)
        bonus += result.stats.accepted_per_position[1] if len(result.stats.accepted_per_position) > 1 else 0
    for n, tally in tallies.items():
        assert tally.pvalue() > ALPHA, (n, tally.pvalue())
    whole = tallies[4]
    rate = whole.accepted / whole.drafted  # drafts were accepted, and rejected, at every position
    assert 0.3 < rate < 0.95, rate
    assert bonus > 0.4 * SAMPLES, bonus  # the bonus token was drawn in most generations
    assert whole.ahead_used > 0.3 * SAMPLES, whole.ahead_used  # usually, token 4 was drafted ahead


def _seeded_command(url: str, draft_path, seed: int, *extra: str) -> list[int]:
    """The tokens `specwire generate --mode rounds --seed S` prints, with the seeded case's flags."""
    done = subprocess.run(
        [SPECWIRE, "generate", "--mode", "rounds", "--server", url, "--draft", str(draft_path),
         "--prompt", PROMPT_TEXT, "--temperature", str(SEEDED.temperature), "--top-k", str(SEEDED.top_k),
         "--top-p", str(SEEDED.top_p), "--k", str(SEEDED_K), "--max-tokens", str(SEEDED_MAX_TOKENS),
         "--seed", str(seed), "--json", *extra], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["token_ids"]


def test_the_seeded_command_makes_what_a_reseeded_session_makes(service_on, close_draft, tiny):
    """`specwire generate --mode rounds --seed S`, a process per seed, makes what the seeded case's
    session re-keyed with S makes, for its first SEEDED_CLI_SEEDS seeds: its statistics are the
    command's. Drafting ahead, the text after the first round depends on when its verdict came
    back (docs/seeded-sampling.md: a seed fixes the whole text with `--no-pipeline`), so the
    first round's tokens are compared, and with `--no-pipeline` the whole reply."""
    service = service_on(SEEDED_BACKEND)
    client, speculator = _seeded_speculator(service.url, close_draft)
    prompt = close_draft.tokenize(PROMPT_TEXT)
    first_round = SEEDED_K + 1
    for seed in SEEDED_SEEDS[:SEEDED_CLI_SEEDS]:
        speculator.reseed(seed)
        made = speculator.generate(prompt, SEEDED_MAX_TOKENS).token_ids
        assert _seeded_command(service.url, tiny.draft, seed)[:first_round] == made[:first_round], seed
    speculator = Speculator(close_draft, client, SEEDED, k=SEEDED_K, pipeline=False)
    for seed in SEEDED_SEEDS[:SEEDED_CLI_WHOLE_SEEDS]:
        speculator.reseed(seed)
        made = speculator.generate(prompt, SEEDED_MAX_TOKENS).token_ids
        assert _seeded_command(service.url, tiny.draft, seed, "--no-pipeline") == made, seed
    client.close()
