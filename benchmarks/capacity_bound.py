"""The most users a target profile could serve at a per-user rate, by arithmetic alone.

    .venv/bin/python -m benchmarks.capacity_bound [--emulate h100x2-70b-fp8] [--level-tok-s 30]
        [--context 200,400] [--budgets 256,512,member:4,none] [--max-tokens 96]

An upper bound to hold the capacity search's figures against (`benchmarks.load --capacity`): n
users in every pass, each member guessing a chain of g tokens (the same g for all, the best one for
the rate, in tenths: a member that guesses 1.5 guesses 2 in half its passes), right as often as the default pair's recording says a chain of g is right along the
target's own path (`--max-tokens` of each reply), each pass costing what the target profile says a
pass of n members and n (1 + g) tokens, each member `--context` tokens deep, costs. No prompt is
read, nobody waits for a round trip or for the queue, and every guess is there when its pass forms;
server-only is the same with g = 0. A user's rate is (1 + the guesses kept) over the pass's time;
the users served are the most n at which that reaches `--level-tok-s`.

A budget bounds a pass's tokens: a number (the service's `--batch-tokens`), `member:K` (K a member),
`member:K+N` (N, or K a member where that is more: the service's rule, remote_verify/scheduler.py),
or `none`. Every figure is emulated, by the profile named.
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


def user_rate(profile, kept: list[float], members: int, guesses: float, context: int) -> float:
    """Tokens/s of each of `members` users, each guessing a chain of `guesses` a pass on average (whole
    chains: 1.5 is a chain of 2 in half the passes and of 1 in the other half)."""
    whole = int(guesses)
    kept_now = kept[whole] + (guesses - whole) * (kept[min(whole + 1, len(kept) - 1)] - kept[whole])
    return (1 + kept_now) / profile.pass_ms(members * (1 + guesses), members, members * context) * 1000


def best_rate(profile, kept: list[float], members: int, context: int, budget: Budget) -> tuple[float, float]:
    """The best (rate, chain length) for `members` users within the budget (no guesses always fits)."""
    lengths = (step / STEPS for step in range((len(kept) - 1) * STEPS + 1))
    return max((user_rate(profile, kept, members, g, context), g) for g in lengths
               if g == 0 or budget.allows(members, members * (1 + g)))


def users_served(profile, kept: list[float], level_tok_s: float, context: int, budget: Budget | None) -> int:
    """The most users at `level_tok_s` each (budget None: server-only, no guesses)."""
    users = 0
    while users < MOST_USERS:
        rate = user_rate(profile, kept, users + 1, 0, context) if budget is None else \
            best_rate(profile, kept, users + 1, context, budget)[0]
        if rate < level_tok_s:
            break
        users += 1
    return users


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulate", default="h100x2-70b-fp8", help="the target profile")
    parser.add_argument("--level-tok-s", type=float, default=30.0, help="each user's tokens/s (default 30)")
    parser.add_argument("--context", default="200,400", help="tokens each member holds, comma-separated")
    parser.add_argument("--budgets", default=f"{BATCH_TOKENS},member:{MEMBER_TOKENS}+{BATCH_TOKENS},none",
                        help="pass budgets, comma-separated: N, member:K, member:K+N, none")
    parser.add_argument("--max-tokens", type=int, default=96, help="each reply's tokens along the recorded path")
    args = parser.parse_args()
    try:
        profile = load_target_profile(args.emulate)
        budgets = [Budget.parse(text) for text in args.budgets.split(",")]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    kept = chain_kept(Recording.load(DEFAULT_RECORDING), args.max_tokens)
    print(f"EMULATED bound ({profile.name}, the default pair's chain acceptance): guesses kept by chain length "
          + " ".join(f"{g}: {k:.2f}" for g, k in enumerate(kept) if g <= 8))
    print("| emulated | context tokens | pass budget | server-only users | default users at best | x | chain a member there |")
    print("|---|---|---|---|---|---|---|")
    for context in (int(c) for c in args.context.split(",")):
        server = users_served(profile, kept, args.level_tok_s, context, None)
        for budget in budgets:
            users = users_served(profile, kept, args.level_tok_s, context, budget)
            chain = best_rate(profile, kept, max(users, 1), context, budget)[1]
            print(f"| {profile.name} | {context} | {budget} | {server} | {users} | {users / max(server, 1):.2f}x | {chain:g} |")


if __name__ == "__main__":
    main()
