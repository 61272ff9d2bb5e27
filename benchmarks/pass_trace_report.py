"""Where a service's first tokens waited, read from its pass trace (`specwire serve --trace-passes FILE`).

    python -m benchmarks.pass_trace_report FILE [--time-scale F] [--json] [--mode M] [--rtt-ms R] [--everything]

Each reply's first token, from its request reaching the queue to the end of the pass that made it, is
split four ways: the rest of the pass running when the request came, the passes it waited out (begun
after it came, before its own), the pass that made it, and the device thread's time between those passes
(forming them, a stream's start). A client sees only the sum
(and the round trip); docs/results.md reads the tail of the sum from this split. An emulated service's
times are its device's times `--time-scale` times over: they are divided back.

Of the sum, the part that was other members' guesses: each of those passes beyond its plain pass (the
ledger's: every member's own tokens, no guesses; remote_verify/pass_ledger.py), and of the running one as much
as the request waited of it (run without them, it would have ended that much sooner). A first token should
wait behind no one's guesses; what it waits beyond server-only's otherwise is the load (under a closed loop a
faster mode is asked more prompts, which meet in the passes that make their first tokens). The p50 and p99 of the
sums less that part: the first tokens as they would have read had every pass they waited on run without guesses
and the requests come as they did. Not a forecast: a shorter pass also moves the requests its
replies send, which a trace cannot say and a run can (the emulated RTX 3090 at 32 users with no guess in a first
token's passes read a p99 of 65.9 ms where its trace with guesses, less them, said 82.4: docs/results.md).

Also the device thread's time from each pass's end to the next one's start (forming the next pass, handing
back the last one's results), in this machine's own ms: not divided, because on a real device the device
waits that long whatever the emulation's scale; and how many first tokens a pass made, and a second: under
a closed loop a mode that finishes replies sooner is asked more prompts, and where nearly every pass makes
one, a first token waits about two passes, whatever their room.

`benchmarks.load --trace-passes` marks each wave's measured window in the file (a `{"window": [start,
end], ...}` line, on the same monotonic clock); where the file has such marks, only the passes that began
and the first tokens whose requests came within one are read, as the benchmark's own figures are (a
warm-up's first wave, every user's prompt at once, would otherwise weigh on every mean).
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
    arrived: float  # when its request reached the queue
    seconds: float  # from its request reaching the queue to the end of the pass that made it
    running_s: float  # the rest of the pass running when it came
    waited_passes: int  # passes begun after it came and before its own
    waited_s: float
    own_s: float  # the pass that made it
    prompt: int
    own_over_plain: float | None  # that pass against the ledger's plain pass
    guesses_s: float = 0.0  # of `seconds`, what those passes took beyond their plain passes (others' guesses)


def read(path: Path) -> list[Pass]:
    """The trace's passes in the order they began (a line that is not a pass is skipped)."""
    passes = []
    for record in _records(path):
        if "pass" in record:
            passes.append(Pass(record["pass"], record["s"], record["members"], record["tokens"], record["own"],
                               record.get("budget"), record.get("plain_s"), record.get("first", [])))
    return sorted(passes, key=lambda each: each.began)


def read_windows(path: Path, mode: str | None = None, rtt_ms: float | None = None) -> list[tuple[float, float]]:
    """The measured windows marked in the trace (`mark_window`), in the order written: every wave's, or
    `mode`'s (a run of both modes writes both into one trace), at `rtt_ms` where given (a run of several)."""
    return [tuple(record["window"]) for record in _records(path)
            if "window" in record and (mode is None or record.get("mode") == mode)
            and (rtt_ms is None or record.get("rtt_ms") == rtt_ms)]


def mark_window(path: Path, start: float, end: float, **about) -> None:
    """Add a wave's measured window (time.perf_counter values: one monotonic clock for every process on the
    machine, the service's too) to the trace at `path`, with what the wave was (`about`: its mode, users).
    The service appends its passes to the same file a line at a time; this line is appended whole too."""
    with Path(path).open("a", encoding="utf-8") as file:
        file.write(json.dumps({"window": [start, end], **about}, separators=(",", ":")) + "\n")


def in_windows(t: float, windows: list[tuple[float, float]]) -> bool:
    """Whether `t` falls in one of `windows` (every time does where there are none)."""
    return not windows or any(start <= t < end for start, end in windows)


def _records(path: Path):
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


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
            # without its guesses the running pass would have ended that much sooner: by them, or by what it
            # waited of that pass where it came later than the pass's plain length
            running_guesses_s = min(_beyond_plain(running), running.ended - arrived) if running else 0.0
            found.append(FirstToken(
                arrived=arrived, seconds=made.ended - arrived, running_s=running.ended - arrived if running else 0.0,
                waited_passes=len(waited), waited_s=sum(each.seconds for each in waited), own_s=made.seconds,
                prompt=prompt, own_over_plain=made.seconds / made.plain_s if made.plain_s else None,
                guesses_s=running_guesses_s + sum(_beyond_plain(each) for each in waited) + _beyond_plain(made)))
    return found


def _beyond_plain(shared: Pass) -> float:
    """What `shared` took beyond its plain pass: its guesses (0 where the trace gives no plain pass: no fair passes,
    or a pass of one member; where the plain pass counts streams server-only would run, it is longer than the
    members' own tokens take, and this less than the guesses took)."""
    return max(0.0, shared.seconds - shared.plain_s) if shared.plain_s else 0.0


def summary(passes: list[Pass], time_scale: float = 1.0, windows: list[tuple[float, float]] = ()) -> dict:
    """The passes and the first tokens in figures, times in the device's ms (between passes: this machine's):
    of the passes begun and the first tokens asked in `windows` (all, where none)."""
    ms = 1000.0 / time_scale
    counted = [each for each in passes if in_windows(each.began, windows)]
    between = [max(0.0, later.began - each.ended) * 1000.0 for each, later in zip(passes, passes[1:])
               if in_windows(each.began, windows) and in_windows(later.began, windows)]
    # a first token's split reads the passes around it, whether or not they began in a window
    firsts = sorted((each for each in first_tokens(passes) if in_windows(each.arrived, windows)),
                    key=lambda each: each.seconds)
    tail = firsts[-max(1, int(round(len(firsts) * TAIL))):] if firsts else []
    span_s = sum(end - start for start, end in windows) if windows else \
        (passes[-1].ended - passes[0].began if passes else 0.0)
    device_s = span_s / time_scale  # the emulated device's seconds the figures are over

    return {
        "windows": len(windows),
        "passes": len(counted),
        "passes_a_second": len(counted) / device_s if device_s > 0 else 0.0,
        "first_tokens_a_second": len(firsts) / device_s if device_s > 0 else 0.0,
        "first_tokens_a_pass": len(firsts) / len(counted) if counted else 0.0,
        "pass_ms_mean": mean(each.seconds * ms for each in counted),
        "tokens_a_pass": mean(each.tokens for each in counted),
        "own_tokens_a_pass": mean(each.own for each in counted),
        "passes_beyond_budget": sum(1 for each in counted if each.budget is not None and each.own > each.budget),
        "between_passes_p50_ms": percentile(between, 50),  # this machine's ms, not divided by the time scale
        "between_passes_p90_ms": percentile(between, 90),
        "first_tokens": len(firsts),
        "first_token_p50_ms": percentile([each.seconds * ms for each in firsts], 50),
        "first_token_p99_ms": percentile([each.seconds * ms for each in firsts], 99),
        # the same first tokens less the others' guesses they waited on, the passes and requests as they were
        "first_token_p50_less_guesses_ms": percentile([(each.seconds - each.guesses_s) * ms for each in firsts], 50),
        "first_token_p99_less_guesses_ms": percentile([(each.seconds - each.guesses_s) * ms for each in firsts], 99),
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
            "guesses_ms": mean(each.guesses_s * ms for each in firsts),
            "own_over_plain": mean(each.own_over_plain for each in firsts if each.own_over_plain is not None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="a file written by specwire serve --trace-passes")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="the emulated service's --time-scale: its times are divided by it (default 1)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--mode", help="only the windows of the waves of this mode (server, default, ...)")
    parser.add_argument("--rtt-ms", type=float, help="only the windows of the waves at this round trip")
    parser.add_argument("--everything", action="store_true",
                        help="read every pass and first token, where the file marks the benchmark's measured "
                        "windows (benchmarks.load --trace-passes): by default only those within them")
    args = parser.parse_args()
    if not args.time_scale > 0:
        raise SystemExit(f"--time-scale must be more than 0, got {args.time_scale}")
    if not args.trace.is_file():
        raise SystemExit(f"no pass trace at {args.trace}: write one with specwire serve --trace-passes FILE")
    windows = [] if args.everything else read_windows(args.trace, args.mode, args.rtt_ms)
    if (args.mode is not None or args.rtt_ms is not None) and not windows:
        raise SystemExit(f"no measured window of mode {args.mode or 'any'} at {args.rtt_ms or 'any'} ms round trip "
                         f"is marked in {args.trace}: benchmarks.load --trace-passes marks each wave's")
    said = summary(read(args.trace), args.time_scale, windows)
    if args.json:
        print(json.dumps(said, indent=1))
        return
    tail = said["tail"]
    print(f"over {said['windows']} measured windows (the benchmark's)" if windows else
          "over the whole trace (warm-ups too)")
    print(f"{said['passes']} passes, {said['pass_ms_mean']:.1f} ms and {said['tokens_a_pass']:.0f} tokens on average "
          f"({said['own_tokens_a_pass']:.0f} the members' own), {said['passes_beyond_budget']} beyond the budget; "
          f"{said['passes_a_second']:.1f} passes and {said['first_tokens_a_second']:.1f} first tokens a second "
          f"({said['first_tokens_a_pass']:.2f} a pass)")
    print(f"the device thread between passes: p50 {said['between_passes_p50_ms']:.1f} ms, p90 "
          f"{said['between_passes_p90_ms']:.1f} ms of this machine's time (not divided by the time scale)")
    print(f"{said['first_tokens']} first tokens: p50 {said['first_token_p50_ms']:.1f} ms, p99 "
          f"{said['first_token_p99_ms']:.1f} ms; {said['first_tokens_that_waited_a_pass']} waited a pass or more "
          f"besides the one running when they came")
    print(f"the same less the others' guesses they waited on (every pass run without them, the requests as they "
          f"came): p50 {said['first_token_p50_less_guesses_ms']:.1f} ms, p99 "
          f"{said['first_token_p99_less_guesses_ms']:.1f} ms")
    for name, split in (("the median one", said["median"]), (f"the slowest {tail['first_tokens']}", tail)):
        print(f"{name}: {split['ms']:.1f} ms = {split['running_ms']:.1f} of the pass running when it came + "
              f"{split['waited_ms']:.1f} in {split['waited_passes']:.2f} passes waited out + {split['own_ms']:.1f} of "
              f"its own + {split['between_ms']:.1f} between passes ({split['prompt_tokens']:.0f} prompt tokens; its "
              f"pass {split['own_over_plain']:.2f}x the plain one; {split['guesses_ms']:.1f} ms of it others' guesses)")


if __name__ == "__main__":
    main()
