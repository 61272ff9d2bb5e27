"""The most users a target profile could serve at a per-user rate, by arithmetic alone.

    .venv/bin/python -m benchmarks.capacity_bound [--emulate h100x2-70b-fp8] [--level-tok-s 30]
        [--context 200,400] [--budgets 256,member:4+256,none] [--max-tokens 96] [--reply-every 0,6]
        [--no-prompts]

An upper bound to hold the capacity search's figures against (`benchmarks.load --capacity`): every
member of every pass guessing a chain of g tokens (the same g for all, the best one for the rate, in
tenths: a member that guesses 1.5 guesses 2 in half its passes), right as often as the default pair's
recording says a chain of g is right along the target's own path (`--max-tokens` of each reply),
each pass costing what the target profile says a pass of its members and tokens costs, each member
`--context` tokens deep. Nobody waits for a round trip or for the queue, and every guess is there when
its pass forms; server-only is the same with g = 0. A user's rate is (1 + the guesses kept) a pass.

How users ask (`--reply-every`, as `benchmarks.load`'s): 0, a closed loop, every user in every pass,
its next prompt as its reply ends; S, a reply every S seconds a user, so that at the level's rate a
user is in the passes for a reply's time of every S (people reading between replies). Each reply's
prompt is read in the passes (its tokens: the recording's prompts' mean), as often as replies begin:
a faster mode reads a closed loop's prompts more often, a paced one at the users' pace whatever the
mode. `--no-prompts`: none read (the bound as first written). The users served are the most at which
the level's rate fits the device: under a closed loop each user's rate reaches it, paced the passes
that rate needs take no more than the device's time.

A budget bounds a pass's tokens: a number (the service's `--batch-tokens`), `member:K` (K a member),
`member:K+N` (N, or K a member where that is more: the service's rule, remote_verify/scheduler.py),
or `none`; guesses fit only beside what the members must feed. Every figure is emulated, by the
profile named.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from benchmarks.emulation.profiles import load_target_profile
from benchmarks.emulation.recording import DEFAULT_RECORDING, Recording
from wire.limits import BATCH_TOKENS, MEMBER_TOKENS

LONGEST_CHAIN = 12
STEPS = 10  # chain lengths tried: tenths of a guess
MOST_USERS = 1024


def chain_kept(recording: Recording, max_tokens: int, longest: int = LONGEST_CHAIN) -> list[float]:
    """kept[g]: the guesses a chain of g keeps, on average over every position of the target's paths
    (their first `max_tokens`): the run of the drafter's recorded guesses equal to the path from there."""
    totals, positions = [0.0] * (longest + 1), 0
    for entry in recording.entries:
        path = entry.path[:max_tokens]
        for start in range(len(path)):
            run = 0
            while start + run < len(path) and entry.guesses[start + run] == path[start + run]:
                run += 1
            for g in range(longest + 1):
                totals[g] += min(run, g)
            positions += 1
    return [total / max(positions, 1) for total in totals]


@dataclass(frozen=True)
class Budget:
    """Tokens a pass of n members may feed: max(`tokens`, `per_member` n); None: unbounded."""

    tokens: int | None
    per_member: int = 0

    @classmethod
    def parse(cls, text: str) -> "Budget":
        try:
            if text == "none":
                return cls(None)
            if text.startswith("member:"):
                per, _, floor = text.removeprefix("member:").partition("+")
                return cls(int(floor) if floor else 0, int(per))
            return cls(int(text))
        except ValueError:
            raise ValueError(f"a budget is a number of tokens, member:K, member:K+N or none; got {text!r}") from None

    def allows(self, members: int, tokens: int) -> bool:
        return self.tokens is None or tokens <= max(self.tokens, self.per_member * members)

    def __str__(self) -> str:
        if self.tokens is None:
            return "none"
        if self.per_member:
            return f"{self.per_member} a member" + (f" or {self.tokens}" if self.tokens else "")
        return str(self.tokens)


@dataclass(frozen=True)
class Load:
    """How users ask: `pace_s` 0, a closed loop, else a reply every `pace_s` seconds a user; each reply
    `max_tokens` long after a prompt of `prompt_tokens` (0: no prompt is read)."""

    pace_s: float = 0.0
    prompt_tokens: float = 0.0
    max_tokens: int = 96

    def __str__(self) -> str:
        asks = f"a reply every {self.pace_s:g} s" if self.pace_s else "closed loop"
        return asks + (f", prompts of {self.prompt_tokens:.0f}" if self.prompt_tokens else ", no prompts")


def kept_by(kept: list[float], guesses: float) -> float:
    """The guesses a member keeps a pass guessing `guesses` on average (whole chains: 1.5 is a chain of 2
    in half the passes and of 1 in the other half)."""
    whole = int(guesses)
    return kept[whole] + (guesses - whole) * (kept[min(whole + 1, len(kept) - 1)] - kept[whole])


def chain_lengths(kept: list[float]) -> list[float]:
    """The chain lengths tried, in tenths of a guess, up to the longest `kept` holds."""
    return [step / STEPS for step in range((len(kept) - 1) * STEPS + 1)]


def user_rate(profile, kept: list[float], members: int, guesses: float, context: int, load: Load = Load()) -> float:
    """Tokens/s of each of `members` users under a closed loop, each guessing `guesses` a pass: each pass
    also reads the prompts of the replies its members begin, one every max_tokens / (1 + kept) passes."""
    made = 1 + kept_by(kept, guesses)
    prompts = members * load.prompt_tokens * made / load.max_tokens
    return made / profile.pass_ms(members * (1 + guesses) + prompts, members, members * context, context) * 1000


def paced_busy(profile, kept: list[float], users: int, guesses: float, context: int, load: Load,
               rate: float) -> tuple[float, float, float]:
    """(the device's share of time busy, the tokens a pass feeds, its members) where `users`, each asking a reply every
    pace, are served at `rate`: a user streams max_tokens / rate seconds of each pace (all of it where
    that is longer: a closed loop), in passes rate / (1 + kept) a second, which also read the prompts
    of the users' replies, users / pace of them a second."""
    made = 1 + kept_by(kept, guesses)
    passes_per_s = rate / made
    members = users * min(1.0, load.max_tokens / rate / load.pace_s)
    tokens = members * (1 + guesses) + users / load.pace_s * load.prompt_tokens / passes_per_s
    ms = profile.pass_ms(tokens, max(1, round(members)), members * context, context)
    return passes_per_s * ms / 1000, tokens, members


def best_rate(profile, kept: list[float], members: int, context: int, budget: Budget,
              load: Load = Load()) -> tuple[float, float]:
    """The best (rate, chain length) for `members` users under a closed loop within the budget (no
    guesses always fits)."""
    def fits(g: float) -> bool:
        made = 1 + kept_by(kept, g)
        return g == 0 or budget.allows(members, members * (1 + g + load.prompt_tokens * made / load.max_tokens))
    return max((user_rate(profile, kept, members, g, context, load), g) for g in chain_lengths(kept) if fits(g))


def paced_best(profile, kept: list[float], users: int, context: int, budget: Budget | None, load: Load,
               level_tok_s: float) -> tuple[float, float]:
    """The least (device's share busy, chain length) at which paced `users` are served at `level_tok_s`,
    within the budget (None: server-only, no guesses). At a higher rate than the level a user holds its
    passes for less time but there are more of them, each costing the fixed part of a pass again: the
    level's rate is the cheapest, and a share above 1 means the device cannot serve these users at it."""
    best = (float("inf"), 0.0)
    for g in [0.0] if budget is None else chain_lengths(kept):
        busy, tokens, members = paced_busy(profile, kept, users, g, context, load, level_tok_s)
        if g == 0 or budget.allows(max(1, round(members)), tokens):
            best = min(best, (busy, g))
    return best


def users_served(profile, kept: list[float], level_tok_s: float, context: int, budget: Budget | None,
                 load: Load = Load()) -> int:
    """The most users at `level_tok_s` each (budget None: server-only, no guesses)."""
    def served(users: int) -> bool:
        if load.pace_s:
            return paced_best(profile, kept, users, context, budget, load, level_tok_s)[0] <= 1.0
        rate = user_rate(profile, kept, users, 0, context, load) if budget is None else \
            best_rate(profile, kept, users, context, budget, load)[0]
        return rate >= level_tok_s

    low, high = 0, MOST_USERS + 1  # served(low) (none are, trivially); high: not searched beyond
    while high - low > 1:  # the device's load grows with the users: the served are a prefix
        middle = (low + high) // 2
        low, high = (middle, high) if served(middle) else (low, middle)
    return min(low, MOST_USERS)


def chain_there(profile, kept: list[float], users: int, level_tok_s: float, context: int, budget: Budget,
                load: Load) -> float:
    """The chain a member guesses at the bound's users."""
    if load.pace_s:
        return paced_best(profile, kept, max(users, 1), context, budget, load, level_tok_s)[1]
    return best_rate(profile, kept, max(users, 1), context, budget, load)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulate", default="h100x2-70b-fp8", help="the target profile")
    parser.add_argument("--level-tok-s", type=float, default=30.0, help="each user's tokens/s (default 30)")
    parser.add_argument("--context", default="200,400", help="tokens each member holds, comma-separated")
    parser.add_argument("--budgets", default=f"{BATCH_TOKENS},member:{MEMBER_TOKENS}+{BATCH_TOKENS},none",
                        help="pass budgets, comma-separated: N, member:K, member:K+N, none")
    parser.add_argument("--max-tokens", type=int, default=96, help="each reply's tokens along the recorded path")
    parser.add_argument("--reply-every", default="0", help="seconds between a user's replies, comma-separated "
                        "(0: a closed loop; benchmarks.load's --reply-every)")
    parser.add_argument("--prompts", action=argparse.BooleanOptionalAction, default=True,
                        help="each reply's prompt read in the passes (the recording's prompts' mean length; "
                        "default); --no-prompts: none")
    args = parser.parse_args()
    try:
        profile = load_target_profile(args.emulate)
        budgets = [Budget.parse(text) for text in args.budgets.split(",")]
        paces = [float(text) for text in args.reply_every.split(",")]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if any(pace < 0 or 0 < pace * args.level_tok_s < args.max_tokens for pace in paces):
        raise SystemExit(f"--reply-every is 0 (a closed loop) or at least a reply's time at the level "
                         f"({args.max_tokens / args.level_tok_s:g} s for {args.max_tokens} tokens at "
                         f"{args.level_tok_s:g} tokens/s); got {args.reply_every}")
    recording = Recording.load(DEFAULT_RECORDING)
    kept = chain_kept(recording, args.max_tokens)
    prompt = sum(len(entry.prompt) for entry in recording.entries) / len(recording.entries) if args.prompts else 0.0
    print(f"EMULATED bound ({profile.name}, the default pair's chain acceptance): guesses kept by chain length "
          + " ".join(f"{g}: {k:.2f}" for g, k in enumerate(kept) if g <= 8))
    print("| emulated | users ask | context tokens | pass budget | server-only users | default users at best | x "
          "| chain a member there |")
    print("|---|---|---|---|---|---|---|---|")
    for pace in paces:
        load = Load(pace, prompt, args.max_tokens)
        for context in (int(c) for c in args.context.split(",")):
            server = users_served(profile, kept, args.level_tok_s, context, None, load)
            for budget in budgets:
                users = users_served(profile, kept, args.level_tok_s, context, budget, load)
                chain = chain_there(profile, kept, users, args.level_tok_s, context, budget, load)
                print(f"| {profile.name} | {load} | {context} | {budget} | {server} | {users} "
                      f"| {users / max(server, 1):.2f}x | {chain:g} |")


if __name__ == "__main__":
    main()
