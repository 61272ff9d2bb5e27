"""Device profiles: what a forward pass or a drafted token costs on hardware this machine lacks.

A profile is a TOML file in profiles/ with its sources beside every figure (`[sources]`),
or one `python -m benchmarks.gpu` wrote from measurements on a real GPU (`measured = true`).
Two kinds:

- "target": c(pass) in ms for a forward pass of the service's target, from
    `pass_ms`: points (n, ms) of one session's pass of n tokens, interpolated between them
      and continued along the last slope past them;
    `session_ms`: each more session sharing the pass;
    `context_ms_per_ktoken`: each 1,000 cached tokens of each member (reading its KV cache);
    `longest_context_ms_per_ktoken`: each 1,000 cached tokens of the pass's longest member, where
      that costs more than the sum above: one row's attention is bound by latency, not by bytes,
      so a few members with long histories pay more than their KV's bandwidth (measured on an
      H200 with the project's torch path: 1.1 ms a 1,000 tokens for a lone 7B session, 0.06 for
      each of 32); the larger of the two terms is the pass's context cost (0: the sum alone);
    `[[check]]`: the source's own figures the profile must reproduce (within CHECK_TOLERANCE): a
      pass of `tokens` (default 1) a member for `sessions` members with `context_tokens` cached
      each takes `ms` by `source` (a serving engine's latency at a concurrency, or a long prompt's).
- "drafter": `token_ms` per drafted token and `prefill_ms_per_token` for reading a text, and
    `batch_cost`: points (b, x) of decoding b sequences one token each for x times one (a tree's
    level of b branches; interpolated, and continued along the last slope; none: b times one).

Every figure made with a profile is emulated, and is labelled with the profile's name.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from wire.cost_curve import interpolate

PROFILES_DIR = Path(__file__).parent / "profiles"
CHECK_TOLERANCE = 0.15  # how far a profile may miss one of its sources' figures


@dataclass(frozen=True)
class SourceCheck:
    """A source's figure: `sessions` members of `tokens` each, `context_tokens` cached each, took `ms`."""

    sessions: int
    context_tokens: int
    ms: float
    source: str
    tokens: int = 1


class ProfileError(ValueError):
    """A profile that does not exist or does not hold what its kind needs."""


@dataclass(frozen=True)
class TargetProfile:
    name: str
    pass_points: tuple[tuple[int, float], ...]  # (tokens, ms) for one session
    session_ms: float = 0.0
    context_ms_per_ktoken: float = 0.0
    longest_context_ms_per_ktoken: float = 0.0
    description: str = ""
    measured: bool = False  # written by benchmarks.gpu on a real GPU
    sources: dict = field(default_factory=dict)
    checks: tuple[SourceCheck, ...] = ()

    def check_ms(self, check: SourceCheck) -> float:
        """What the profile gives for a source's figure."""
        return self.pass_ms(check.tokens * check.sessions, check.sessions, check.context_tokens * check.sessions,
                            check.context_tokens)

    def pass_ms(self, tokens: int, sessions: int = 1, context_tokens: int = 0, longest_context: int = 0) -> float:
        """c(tokens in the pass, sessions in it, cached tokens of all of them, of the longest), in ms."""
        context_ms = max(self.context_ms_per_ktoken * context_tokens,
                         self.longest_context_ms_per_ktoken * longest_context) / 1000
        return interpolate(list(self.pass_points), max(tokens, 1)) + self.session_ms * max(sessions - 1, 0) + context_ms


@dataclass(frozen=True)
class DrafterProfile:
    name: str
    token_ms: float
    prefill_ms_per_token: float
    description: str = ""
    measured: bool = False
    sources: dict = field(default_factory=dict)
    batch_points: tuple[tuple[int, float], ...] = ()  # (sequences, times one sequence's step)

    def batch_cost(self, branches: int) -> float:
        """A step of `branches` sequences over one sequence's (b: a branch costs a step, if not stated)."""
        if branches <= 1:
            return 1.0
        if not self.batch_points:
            return float(branches)
        return max(1.0, interpolate([(1, 1.0)] + list(self.batch_points), branches))

    def level_ms(self, branches: int) -> float:
        """One level of a tree: `branches` guesses decoded together."""
        return self.token_ms * self.batch_cost(branches)

    def read_ms(self, tokens: int) -> float:
        """Evaluating `tokens` new tokens: one is a decode step, more a batch."""
        if tokens <= 0:
            return 0.0
        return self.token_ms if tokens == 1 else self.prefill_ms_per_token * tokens


def profile_names(kind: str | None = None) -> list[str]:
    """Every profile's name (of one kind, if given), sorted."""
    names = []
    for path in sorted(PROFILES_DIR.glob("*.toml")):
        if kind is None or _read(path).get("kind") == kind:
            names.append(path.stem)
    return names


def load_profile(name_or_path: str | Path) -> TargetProfile | DrafterProfile:
    """A profile by name (profiles/NAME.toml) or by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":  # a name ("a100-qwen2.5-1.5b": its dots are not a suffix)
        path = PROFILES_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise ProfileError(f"no device profile {name_or_path!r}: choose one of {', '.join(profile_names())} "
                           f"(or give a profile file's path)")
    data = _read(path)
    kind = data.get("kind")
    try:
        common = dict(name=str(data.get("name", path.stem)), description=str(data.get("description", "")),
                      measured=bool(data.get("measured", False)), sources=dict(data.get("sources", {})))
        if kind == "target":
            points = tuple(sorted((int(n), float(ms)) for n, ms in data["pass_ms"]))
            if not points or any(ms <= 0 for _, ms in points):
                raise ValueError("pass_ms needs at least one (tokens, ms) point with ms > 0")
            checks = tuple(SourceCheck(sessions=int(c["sessions"]), context_tokens=int(c["context_tokens"]),
                                       ms=float(c["ms"]), source=str(c["source"]), tokens=int(c.get("tokens", 1)))
                           for c in data.get("check", []))
            return TargetProfile(pass_points=points, session_ms=float(data.get("session_ms", 0.0)),
                                 context_ms_per_ktoken=float(data.get("context_ms_per_ktoken", 0.0)),
                                 longest_context_ms_per_ktoken=float(data.get("longest_context_ms_per_ktoken", 0.0)),
                                 checks=checks, **common)
        if kind == "drafter":
            batch = tuple(sorted((int(n), float(x)) for n, x in data.get("batch_cost", [])))
            if any(n < 2 or x < 1.0 for n, x in batch):
                raise ValueError("batch_cost needs (sequences >= 2, times one >= 1) points")
            return DrafterProfile(token_ms=float(data["token_ms"]),
                                  prefill_ms_per_token=float(data["prefill_ms_per_token"]), batch_points=batch,
                                  **common)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"the profile {path} is malformed: {exc}") from None
    raise ProfileError(f"the profile {path} has kind {kind!r}: it must be \"target\" or \"drafter\"")


def load_target_profile(name: str | Path) -> TargetProfile:
    profile = load_profile(name)
    if not isinstance(profile, TargetProfile):
        raise ProfileError(f"{name} is a drafter profile; a target profile is one of "
                           f"{', '.join(profile_names('target'))}")
    return profile


def load_drafter_profile(name: str | Path) -> DrafterProfile:
    profile = load_profile(name)
    if not isinstance(profile, DrafterProfile):
        raise ProfileError(f"{name} is a target profile; a drafter profile is one of "
                           f"{', '.join(profile_names('drafter'))}")
    return profile


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"cannot read the profile {path}: {exc}") from None
