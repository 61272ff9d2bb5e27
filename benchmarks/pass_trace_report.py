"""Where a service's first tokens waited, read from its pass trace (`specwire serve --trace-passes FILE`).

    python -m benchmarks.pass_trace_report FILE [--time-scale F] [--json]

Each reply's first token, from its request reaching the queue to the end of the pass that made it, is
split four ways: the rest of the pass running when the request came, the passes it waited out (begun
after it came, before its own), the pass that made it, and the device thread's time between those passes
(forming them, a stream's start). A client sees only the sum
(and the round trip); docs/results.md reads the tail of the sum from this split. An emulated service's
times are its device's times `--time-scale` times over: they are divided back.

Also the device thread's time from each pass's end to the next one's start (forming the next pass, handing
back the last one's results), in this machine's own ms: not divided, because on a real device the device
waits that long whatever the emulation's scale.
"""

from __future__ import annotations

import argparse
import bisect
import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.service_level import percentile

TAIL = 0.03  # the slowest first tokens whose split the summary gives: about the p99's neighbours


@dataclass
class Pass:
    began: float
    seconds: float
    members: int
    tokens: int
    own: int  # the tokens its members had to feed (guesses are the rest)
    budget: float | None
    plain_s: float | None
    first: list  # [session, prompt tokens, arrived] of each first token it made

    @property
    def ended(self) -> float:
        return self.began + self.seconds


@dataclass
class FirstToken:
    seconds: float  # from its request reaching the queue to the end of the pass that made it
    running_s: float  # the rest of the pass running when it came
    waited_passes: int  # passes begun after it came and before its own
    waited_s: float
    own_s: float  # the pass that made it
    prompt: int
    own_over_plain: float | None  # that pass against the ledger's plain pass


def read(path: Path) -> list[Pass]:
    """The trace's passes in the order they began (a line that is not a pass is skipped)."""
    passes = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "pass" in record:
            passes.append(Pass(record["pass"], record["s"], record["members"], record["tokens"], record["own"],
                               record.get("budget"), record.get("plain_s"), record.get("first", [])))
    return sorted(passes, key=lambda each: each.began)


def first_tokens(passes: list[Pass]) -> list[FirstToken]:
    """Every first token the passes made, split as the module says."""
    starts = [each.began for each in passes]
    found = []
    for index, made in enumerate(passes):
        for _, prompt, arrived in made.first:
            running = next((each for each in passes[max(0, bisect.bisect_right(starts, arrived) - 1):index]
                            if each.began <= arrived < each.ended), None)
            waited = passes[bisect.bisect_left(starts, arrived):index]
            waited = [each for each in waited if each is not running]
            found.append(FirstToken(
                seconds=made.ended - arrived, running_s=running.ended - arrived if running else 0.0,
                waited_passes=len(waited), waited_s=sum(each.seconds for each in waited), own_s=made.seconds,
                prompt=prompt, own_over_plain=made.seconds / made.plain_s if made.plain_s else None))
    return found


def summary(passes: list[Pass], time_scale: float = 1.0) -> dict:
    """The passes and the first tokens in figures, times in the device's ms (between passes: this machine's)."""
    ms = 1000.0 / time_scale
    between = [max(0.0, later.began - each.ended) * 1000.0 for each, later in zip(passes, passes[1:])]
    firsts = sorted(first_tokens(passes), key=lambda each: each.seconds)
    tail = firsts[-max(1, int(round(len(firsts) * TAIL))):] if firsts else []

    return {
        "passes": len(passes),
        "pass_ms_mean": mean(each.seconds * ms for each in passes),
        "tokens_a_pass": mean(each.tokens for each in passes),
        "own_tokens_a_pass": mean(each.own for each in passes),
        "passes_beyond_budget": sum(1 for each in passes if each.budget is not None and each.own > each.budget),
        "between_passes_p50_ms": percentile(between, 50),  # this machine's ms, not divided by the time scale
        "between_passes_p90_ms": percentile(between, 90),
        "first_tokens": len(firsts),
        "first_token_p50_ms": percentile([each.seconds * ms for each in firsts], 50),
        "first_token_p99_ms": percentile([each.seconds * ms for each in firsts], 99),
        "first_tokens_that_waited_a_pass": sum(1 for each in firsts if each.waited_passes),
        "tail": _split(tail, ms),  # the slowest TAIL of them
        "median": _split(firsts[len(firsts) // 2:len(firsts) // 2 + 1], ms),  # the middle one
    }


def mean(values) -> float:
    """The mean of `values` (0.0 for none)."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _split(firsts: list[FirstToken], ms: float) -> dict:
    """The mean split of `firsts`, times in ms."""
    return {"first_tokens": len(firsts), "ms": mean(each.seconds * ms for each in firsts),
            "running_ms": mean(each.running_s * ms for each in firsts),
            "waited_passes": mean(each.waited_passes for each in firsts),
            "waited_ms": mean(each.waited_s * ms for each in firsts), "own_ms": mean(each.own_s * ms for each in firsts),
            "between_ms": mean((each.seconds - each.running_s - each.waited_s - each.own_s) * ms for each in firsts),
            "prompt_tokens": mean(each.prompt for each in firsts),
            "own_over_plain": mean(each.own_over_plain for each in firsts if each.own_over_plain is not None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="a file written by specwire serve --trace-passes")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="the emulated service's --time-scale: its times are divided by it (default 1)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    if not args.time_scale > 0:
        raise SystemExit(f"--time-scale must be more than 0, got {args.time_scale}")
    if not args.trace.is_file():
        raise SystemExit(f"no pass trace at {args.trace}: write one with specwire serve --trace-passes FILE")
    said = summary(read(args.trace), args.time_scale)
    if args.json:
        print(json.dumps(said, indent=1))
        return
    tail = said["tail"]
    print(f"{said['passes']} passes, {said['pass_ms_mean']:.1f} ms and {said['tokens_a_pass']:.0f} tokens on average "
          f"({said['own_tokens_a_pass']:.0f} the members' own), {said['passes_beyond_budget']} beyond the budget")
    print(f"the device thread between passes: p50 {said['between_passes_p50_ms']:.1f} ms, p90 "
          f"{said['between_passes_p90_ms']:.1f} ms of this machine's time (not divided by the time scale)")
    print(f"{said['first_tokens']} first tokens: p50 {said['first_token_p50_ms']:.1f} ms, p99 "
          f"{said['first_token_p99_ms']:.1f} ms; {said['first_tokens_that_waited_a_pass']} waited a pass or more "
          f"besides the one running when they came")
    for name, split in (("the median one", said["median"]), (f"the slowest {tail['first_tokens']}", tail)):
        print(f"{name}: {split['ms']:.1f} ms = {split['running_ms']:.1f} of the pass running when it came + "
              f"{split['waited_ms']:.1f} in {split['waited_passes']:.2f} passes waited out + {split['own_ms']:.1f} of "
              f"its own + {split['between_ms']:.1f} between passes ({split['prompt_tokens']:.0f} prompt tokens; its "
              f"pass {split['own_over_plain']:.2f}x the plain one)")


if __name__ == "__main__":
    main()
