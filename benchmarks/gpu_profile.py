"""An emulator profile fitted to `python -m benchmarks.gpu` reports: the pass curve, the context terms, checks.

    python -m benchmarks.gpu_profile REPORT... --model 7b --name h200-qwen2.5-7b-torch
        [--derived TOKENS=MS ...] [--out FILE]

REPORT: a gpu.json, or a folder holding one; runs of one device, at two or more contexts
(`--context 512`, `--context 2048`, ...), of the static ("fast") path with its default attention
kernel (reports of `--sdpa` other than default are left out). Every timed pass is an observation:
n members of b tokens each, with C tokens cached each, took ms.

- The longest member's term: the slope of a lone one-token pass against its context (latency:
  one row's attention), in ms per 1,000 cached tokens.
- Each member's term: the slope of the most members timed with one token at two contexts or
  more, divided by their number (bandwidth: every member's KV is read).
- A pass's context costs the larger of the two (benchmarks/emulation/profiles.py). The curve is
  each observation at the smallest context less that cost, by the pass's tokens (the median where
  several passes had as many), never falling as tokens grow. `--derived` adds points past the
  measured ones, named as derived in the profile.
- Checks: every pass at another context, and the most members at the smallest, each of which
  the profile must reproduce within 15% (tests/benchmarks/test_profiles.py).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.emulation.profiles import CHECK_TOLERANCE, SourceCheck, TargetProfile


@dataclass(frozen=True)
class Observation:
    members: int
    tokens_each: int
    context: int
    ms: float
    run: str  # the report's folder, for the checks' sources


def observations(reports: list[tuple[str, dict]], model: str) -> list[Observation]:
    """Every timed pass of the static path for `model` in the reports."""
    seen = []
    for run, report in reports:
        if report.get("sdpa", "default") != "default":
            continue
        for m in report["models"]:
            if m["model"] != model:
                continue
            seen += [Observation(1, row["block"], m["context"], row["fast_ms"], run) for row in m["blocks"]]
            seen += [Observation(row["sessions"], report["block"], m["context"], row["fast_round_ms"], run)
                     for row in m["batched"]]
    return seen


def slope_per_ktoken(points: list[tuple[int, float]]) -> float:
    """Least-squares ms per 1,000 tokens of (context, ms) points at two contexts or more."""
    xs, ys = [c / 1000 for c, _ in points], [ms for _, ms in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def medians_by_context(seen: list[Observation]) -> list[tuple[int, float]]:
    contexts = sorted({o.context for o in seen})
    return [(c, statistics.median(o.ms for o in seen if o.context == c)) for c in contexts]


@dataclass(frozen=True)
class Fit:
    points: list[tuple[int, float]]
    each_ms_per_ktoken: float
    longest_ms_per_ktoken: float
    each_members: int  # the member count the bandwidth term was read from
    contexts: list[int]  # the contexts the terms were read at
    base_context: int
    checks: list[Observation]

    def context_ms(self, members: int, context: int) -> float:
        return max(self.each_ms_per_ktoken * members * context, self.longest_ms_per_ktoken * context) / 1000


def fit(seen: list[Observation], derived: dict[int, float] | None = None) -> Fit:
    lone = [o for o in seen if o.members == 1 and o.tokens_each == 1]
    if len({o.context for o in lone}) < 2:
        raise ValueError("the reports need a lone one-token pass at two contexts or more (benchmarks.gpu "
                         "--blocks 1 --context N, at two values of N)")
    longest = slope_per_ktoken(medians_by_context(lone))
    crowds = sorted({o.members for o in seen if o.tokens_each == 1 and o.members > 1
                     and len({p.context for p in seen if p.members == o.members and p.tokens_each == 1}) > 1})
    if not crowds:
        raise ValueError("the reports need one-token passes of several members at two contexts or more "
                         "(benchmarks.gpu --block 1 --sessions ... --context N, at two values of N)")
    crowd = crowds[-1]
    each = slope_per_ktoken(medians_by_context([o for o in seen if o.members == crowd and o.tokens_each == 1])) / crowd
    base = min(o.context for o in seen)
    contexts = sorted({o.context for o in lone})
    partial = Fit([], each, longest, crowd, contexts, base, [])
    by_tokens: dict[int, list[float]] = {}
    for o in seen:
        if o.context == base:
            by_tokens.setdefault(o.members * o.tokens_each, []).append(o.ms - partial.context_ms(o.members, base))
    points, floor = [], 0.0
    for tokens in sorted(by_tokens):
        floor = max(floor, statistics.median(by_tokens[tokens]))  # more tokens never cost less
        points.append((tokens, round(floor, 2)))
    for tokens, ms in sorted((derived or {}).items()):
        if tokens <= points[-1][0]:
            raise ValueError(f"a derived point goes past the measured ones ({points[-1][0]} tokens): got {tokens}")
        points.append((tokens, ms))
    most = max(o.members for o in seen if o.context == base)
    checks = sorted((o for o in seen if o.context != base or (o.members == most and o.tokens_each == 1)),
                    key=lambda o: (o.context, o.members, o.tokens_each, o.run))
    return Fit(points, each, longest, crowd, contexts, base, checks)


def as_profile(result: Fit, name: str) -> TargetProfile:
    checks = tuple(SourceCheck(sessions=o.members, tokens=o.tokens_each, context_tokens=o.context, ms=o.ms,
                               source=o.run) for o in result.checks)
    return TargetProfile(name=name, pass_points=tuple(result.points),
                         context_ms_per_ktoken=round(result.each_ms_per_ktoken, 3),
                         longest_context_ms_per_ktoken=round(result.longest_ms_per_ktoken, 2), checks=checks)


def profile_toml(result: Fit, name: str, description: str, device: str, command: str,
                 derived: dict[int, float], derived_why: str) -> str:
    profile = as_profile(result, name)
    lines = [f"# MEASURED: written by `{command}`", f'name = "{name}"', 'kind = "target"', "measured = true",
             f'description = "{description}"',
             f"# a pass of n tokens with nothing cached: measured passes at {result.base_context} cached a member, "
             "less their context term" + (f"; past {max(t for t, _ in result.points if t not in derived)} tokens: "
                                          f"derived ({derived_why})" if derived else ""),
             "pass_ms = [" + ", ".join(f"[{n}, {ms:g}]" for n, ms in result.points) + "]",
             "session_ms = 0.0",
             f"# {result.each_members} members of one token at " + " / ".join(map(str, result.contexts)) + " cached each",
             f"context_ms_per_ktoken = {profile.context_ms_per_ktoken:g}",
             "# a lone session of one token at " + " / ".join(map(str, result.contexts)) + " cached",
             f"longest_context_ms_per_ktoken = {profile.longest_context_ms_per_ktoken:g}", ""]
    for check in profile.checks:
        made = profile.check_ms(check)
        lines += ["[[check]]", *( [f"tokens = {check.tokens}"] if check.tokens != 1 else []),
                  f"sessions = {check.sessions}", f"context_tokens = {check.context_tokens}", f"ms = {check.ms:.2f}",
                  f'source = "python -m benchmarks.gpu on {device}: {plural(check.sessions, "member")} of '
                  f'{plural(check.tokens, "token")}, {check.context_tokens} cached each ({check.source}); the '
                  f'profile gives {made:.2f}"', ""]
    lines += ["[sources]",
              f'pass_ms = "measured: python -m benchmarks.gpu on {device}, fitted by python -m benchmarks.gpu_profile'
              + (f'; the points past the measured ones derived: {derived_why}' if derived else "") + '"',
              'session_ms = "measured: folded into the batched points"',
              f'context_ms_per_ktoken = "measured: {result.each_members} one-token members at several contexts"',
              'longest_context_ms_per_ktoken = "measured: a lone one-token session at several contexts"']
    return "\n".join(lines) + "\n"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("s" if n != 1 else "")


def read_reports(paths: list[Path]) -> list[tuple[str, dict]]:
    reports = []
    for path in paths:
        file = path / "gpu.json" if path.is_dir() else path
        if not file.is_file():
            raise SystemExit(f"no benchmarks.gpu report at {path} (a gpu.json, or a folder holding one)")
        reports.append((file.parent.name, json.loads(file.read_text())))
    return reports


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--model", required=True, help="the shape in the reports (benchmarks.gpu --models)")
    parser.add_argument("--name", required=True, help="the profile's name")
    parser.add_argument("--description", default="", help="default: the device, the shape and the path")
    parser.add_argument("--derived", action="append", default=[], metavar="TOKENS=MS",
                        help="a point past the measured ones, worked out by hand (say how in --derived-why)")
    parser.add_argument("--derived-why", default="", help="how the --derived points were worked out")
    parser.add_argument("--out", type=Path, help="write the profile here (default: print it)")
    args = parser.parse_args(argv)
    reports = read_reports(args.reports)
    derived = {}
    for item in args.derived:
        tokens, _, ms = item.partition("=")
        try:
            derived[int(tokens)] = float(ms)
        except ValueError:
            parser.error(f"--derived takes TOKENS=MS, like 320=14.97; got {item!r}")
    if derived and not args.derived_why:
        parser.error("--derived points need --derived-why: how they were worked out")
    seen = observations(reports, args.model)
    if not seen:
        parser.error(f"no pass of the {args.model} shape's static path in the reports")
    try:
        result = fit(seen, derived)
    except ValueError as exc:
        parser.error(str(exc))
    device = reports[0][1]["device"]
    description = args.description or f"MEASURED: {device}, the {args.model} shape, the torch static path"
    command = shlex.join(["python", "-m", "benchmarks.gpu_profile", *map(str, args.reports), "--model", args.model,
                          "--name", args.name, *(["--description", args.description] if args.description else []),
                          *[part for d in args.derived for part in ("--derived", d)],
                          *(["--derived-why", args.derived_why] if args.derived_why else [])])
    text = profile_toml(result, args.name, description, device, command, derived, args.derived_why)
    profile = as_profile(result, args.name)
    misses = [c for c in profile.checks if abs(profile.check_ms(c) - c.ms) > CHECK_TOLERANCE * c.ms]
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    if misses:
        raise SystemExit(f"{len(misses)} measured passes are not reproduced within {CHECK_TOLERANCE:.0%}: the "
                         "model (a curve and two context terms) does not fit these runs")
    return text


if __name__ == "__main__":
    main()
