"""Turn benchmark runs into numbers a person can read: tables, JSON, and a plot.

Every figure is a ratio of sums over the runs of a (mode, round trip, prompt kind) cell:
tokens/s is all tokens over all wall time, passes per token all target forward passes over
all tokens, and so on; time to first token is the mean over prompts.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.bench.modes import FIXED_K, MODES_BY_NAME, Run

log = logging.getLogger(__name__)

ALL = "all"
LOCAL_MODES = ("offline", "hf-assisted")  # no network: one measurement stands for every round trip
SHARED, PINNED = "shared", "pinned"  # `--colocated`: mode names end in /shared or /pinned


@dataclass
class Cell:
    mode: str
    rtt_ms: float
    prompt_kind: str
    prompts: int
    tokens: int
    tokens_per_s: float
    first_token_s: float
    decode_tokens_per_s: float  # after the first token: the reply's own pace, the prompt's reading left out
    passes_per_token: float
    busy_ms_per_token: float
    round_trips_per_token: float
    bytes_per_token: float
    acceptance_by_position: list[float] = field(default_factory=list)
    same_tokens_as_target: int | None = None  # prompts whose output equals the target alone's
    by_source: dict[str, dict] = field(default_factory=dict)  # drafter -> drafted, accepted, acceptance, share


def summarize(runs: list[Run]) -> list[Cell]:
    """One Cell per (mode, round trip, prompt kind), plus each kind pooled as "all"."""
    groups: dict[tuple[str, float, str], list[Run]] = {}
    for run in runs:
        for kind in (run.prompt_kind, ALL):
            groups.setdefault((run.mode, run.rtt_ms, kind), []).append(run)
    # The target alone: server-only, else k0 (every token the service's too). Greedy output does
    # not depend on the round trip: any of its runs of a prompt will do.
    reference = "server" if any(_base(r.mode) == "server" for r in runs) else "k0"
    target_tokens = {(r.prompt_kind, r.prompt_index): r.token_ids for r in runs if _base(r.mode) == reference}
    cells = []
    for (mode, rtt, kind), group in sorted(groups.items(), key=lambda item: (_mode_order(item[0][0]), item[0][1:])):
        tokens = sum(r.tokens for r in group) or 1
        drafted = _sum_lists(r.drafted_per_position for r in group)
        accepted = _sum_lists(r.accepted_per_position for r in group)
        same = None
        if target_tokens and _base(mode) != reference:
            same = sum(target_tokens.get((r.prompt_kind, r.prompt_index)) == r.token_ids for r in group)
        cells.append(Cell(
            mode=mode, rtt_ms=rtt, prompt_kind=kind, prompts=len(group), tokens=tokens,
            tokens_per_s=tokens / max(sum(r.wall_s for r in group), 1e-9),
            first_token_s=sum(r.first_token_s for r in group) / len(group),
            decode_tokens_per_s=sum(r.tokens - 1 for r in group) / max(sum(r.wall_s - r.first_token_s for r in group),
                                                                        1e-9),
            passes_per_token=sum(r.target_passes for r in group) / tokens,
            busy_ms_per_token=1000 * sum(r.service_s for r in group) / tokens,
            round_trips_per_token=sum(r.round_trips for r in group) / tokens,
            bytes_per_token=sum(r.bytes for r in group) / tokens,
            acceptance_by_position=[a / d if d else 0.0 for a, d in zip(accepted, drafted)],
            same_tokens_as_target=same, by_source=_by_source(group, tokens)))
    return cells


def render_tables(cells: list[Cell], rtts_ms: list[float], kinds: list[str]) -> str:
    """The terminal report: tokens/s by round trip for each kind, then every column per cell."""
    out = []
    for kind in kinds + [ALL]:
        rows = [c for c in cells if c.prompt_kind == kind]
        if not rows:
            continue
        header = f"{'tokens/s, ' + kind:28s}" + "".join(f"{f'{rtt:g} ms':>10s}" for rtt in rtts_ms) + \
            "   after the first token: " + " ".join(f"{f'{rtt:g} ms':>8s}" for rtt in rtts_ms)
        out += ["", header, "-" * len(header)]
        for mode in _modes_in(rows):
            by_rtt = {c.rtt_ms: c for c in rows if c.mode == mode}
            values = [by_rtt.get(rtt) or (by_rtt.get(0.0) if _base(mode) in LOCAL_MODES else None) for rtt in rtts_ms]
            out.append(f"{mode:28s}" + "".join(f"{v.tokens_per_s:10.1f}" if v else f"{'-':>10s}" for v in values)
                       + " " * 26 + " ".join(f"{v.decode_tokens_per_s:8.1f}" if v else f"{'-':>8s}" for v in values))
    header = (f"{'mode':17s} {'kind':6s} {'rtt ms':>6s} {'tok/s':>7s} {'ttft s':>7s} {'passes/tok':>10s} "
              f"{'busy ms/tok':>11s} {'trips/tok':>9s} {'bytes/tok':>9s} {'same':>5s}  acceptance by draft position")
    out += ["", header, "-" * len(header)]
    for c in cells:
        same = "" if c.same_tokens_as_target is None else f"{c.same_tokens_as_target}/{c.prompts}"
        acceptance = " ".join(f"{a:.2f}" for a in c.acceptance_by_position[:16]) or "-"
        out.append(f"{c.mode:17s} {c.prompt_kind:6s} {c.rtt_ms:6g} {c.tokens_per_s:7.1f} {c.first_token_s:7.2f} "
                   f"{c.passes_per_token:10.3f} {c.busy_ms_per_token:11.1f} {c.round_trips_per_token:9.3f} "
                   f"{c.bytes_per_token:9.0f} {same:>5s}  {acceptance}")
    return "\n".join(out)


def _by_source(runs: list[Run], tokens: int) -> dict[str, dict]:
    """Per drafter: tokens drafted and accepted, acceptance, and the share of all tokens it gave."""
    totals: dict[str, list[int]] = {}
    for run in runs:
        for source, counts in run.by_source.items():
            total = totals.setdefault(source, [0, 0, 0])
            total[0] += counts["rounds"]
            total[1] += counts["drafted"]
            total[2] += counts["accepted"]
    return {source: {"rounds": r, "drafted": d, "accepted": a, "acceptance": round(a / d, 4) if d else 0.0,
                     "share_of_tokens": round(a / tokens, 4)} for source, (r, d, a) in sorted(totals.items())}


def render_sources(cells: list[Cell]) -> str:
    """Acceptance by drafter, for the cells where more than one kind of draft was made or n-gram drafted."""
    rows = [c for c in cells if "ngram" in c.by_source]
    if not rows:
        return ""
    out = ["", "acceptance by drafter (accepted/drafted = rate; share: of all tokens, accepted drafts of that drafter)"]
    for c in rows:
        parts = [f"{source} {v['accepted']}/{v['drafted']} = {v['acceptance']:.2f} (share {v['share_of_tokens']:.2f})"
                 for source, v in c.by_source.items()]
        out.append(f"  {c.mode:17s} {c.prompt_kind:6s} {c.rtt_ms:6g} ms: " + "; ".join(parts))
    return "\n".join(out)


def render_ngram_checks(cells: list[Cell], rtts_ms: list[float], kinds: list[str], layout: str = "") -> str:
    """The n-gram targets: mixed against the model drafter alone (auto+ahead), ngram against k0."""
    suffix = f"/{layout}" if layout else ""
    index = {(c.mode.removesuffix(suffix), c.rtt_ms, c.prompt_kind): c for c in cells if c.mode.endswith(suffix)}
    out = []
    for kind in kinds + [ALL]:
        for rtt in rtts_ms:
            parts = []
            for mode, base in (("mixed", "auto+ahead"), ("ngram", "k0"), ("ngram", "auto+ahead")):
                if (mode, rtt, kind) in index and (base, rtt, kind) in index:
                    ours, theirs = index[mode, rtt, kind], index[base, rtt, kind]
                    ratio = ours.tokens_per_s / max(theirs.tokens_per_s, 1e-9)
                    after = ours.decode_tokens_per_s / max(theirs.decode_tokens_per_s, 1e-9)
                    parts.append(f"{mode} vs {base} {ratio:.2f}x ({after:.2f}x after the first token)")
            if parts:
                out.append(f"  {kind:6s} {rtt:5g} ms: " + ", ".join(parts))
    if not out:
        return ""
    return "\n".join(["", "n-gram drafting against the model drafter and k0, tokens/s in the same cell "
                      "(first token included, as a user sees it; in brackets, after it)"
                      + (f", {layout}:" if layout else ":")] + out)


def render_checks(cells: list[Cell], rtts_ms: list[float], kinds: list[str], layout: str = "") -> str:
    """Adaptive k against the best fixed k, per kind and round trip (the project's speed targets);
    with a layout, among the modes run in it (named MODE/layout)."""
    suffix = f"/{layout}" if layout else ""
    index = {(c.mode.removesuffix(suffix), c.rtt_ms, c.prompt_kind): c for c in cells if c.mode.endswith(suffix)}
    out = ["", "adaptive k against the best fixed k (k0, k2, k4, k8) in the same cell"
           + (f", {layout}:" if layout else ":")]
    for kind in kinds + [ALL]:
        for rtt in rtts_ms:
            fixed = [index[m, rtt, kind] for m in FIXED_K if (m, rtt, kind) in index]
            if not fixed:
                continue
            best = max(fixed, key=lambda c: c.tokens_per_s)
            parts = []
            for mode in ("auto", "auto+ahead"):
                if (mode, rtt, kind) in index:
                    cell = index[mode, rtt, kind]
                    parts.append(f"{mode} {cell.tokens_per_s / best.tokens_per_s:5.2f}x "
                                 f"({cell.passes_per_token:.2f} passes/token)")
            k0 = index.get(("k0", rtt, kind))
            vs_k0 = ""
            if k0 and ("auto+ahead", rtt, kind) in index:
                vs_k0 = f"; auto+ahead vs k0 {index['auto+ahead', rtt, kind].tokens_per_s / k0.tokens_per_s:.2f}x"
            out.append(f"  {kind:6s} {rtt:5g} ms: best fixed {best.mode} {best.tokens_per_s:.1f} tok/s; "
                       + ", ".join(parts) + vs_k0)
    return "\n".join(out)


def render_stream_checks(cells: list[Cell], rtts_ms: list[float], kinds: list[str], layout: str = "") -> str:
    """The default mode against what a user would pick instead: the service streaming alone
    (`--mode server`, the baseline), one round trip a token (k0) and the round-based loop."""
    suffix = f"/{layout}" if layout else ""
    index = {(c.mode.removesuffix(suffix), c.rtt_ms, c.prompt_kind): c for c in cells if c.mode.endswith(suffix)}
    out = ["", "the default mode against server-only streaming (and k0, auto+ahead) in the same cell"
           + (f", {layout}:" if layout else ":")]
    for kind in kinds + [ALL]:
        for rtt in rtts_ms:
            ours, server = index.get(("default", rtt, kind)), index.get(("server", rtt, kind))
            if ours is None or server is None:
                continue
            parts = [f"tokens/s {ours.tokens_per_s / server.tokens_per_s:.2f}x",
                     f"first token {ours.first_token_s / server.first_token_s:.2f}x",
                     f"target busy time per token {ours.busy_ms_per_token / server.busy_ms_per_token:.2f}x"
                     if server.busy_ms_per_token else "",
                     f"{ours.passes_per_token:.2f} passes/token"]
            for other in ("k0", "auto+ahead"):
                if (other, rtt, kind) in index:
                    parts.append(f"vs {other} {ours.tokens_per_s / index[other, rtt, kind].tokens_per_s:.2f}x")
            out.append(f"  {kind:6s} {rtt:5g} ms: " + ", ".join(p for p in parts if p))
    return "\n".join(out) if len(out) > 1 else ""


def write_json(path: Path, config: dict, runs: list[Run], cells: list[Cell], notes: list[str]) -> None:
    path.write_text(json.dumps({"config": config, "notes": notes, "summary": [asdict(c) for c in cells],
                                "runs": [asdict(r) for r in runs]}, indent=1))


def write_plot(path: Path, cells: list[Cell], rtts_ms: list[float], kinds: list[str]) -> bool:
    """Tokens/s against round-trip time, one line per mode, one panel per prompt kind."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: no plot (pip install 'specwire[bench]')")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in kinds + [ALL] if any(c.prompt_kind == k for c in cells)]
    columns = 2 if len(panels) > 2 else len(panels)
    rows_of_panels = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows_of_panels, columns, figsize=(5.5 * columns, 4 * rows_of_panels), squeeze=False)
    flat = axes.ravel()
    for axis in flat[len(panels):]:
        axis.set_visible(False)
    for axis, kind in zip(flat, panels):
        rows = [c for c in cells if c.prompt_kind == kind]
        for mode in _modes_in(rows):
            points = sorted((c.rtt_ms, c.tokens_per_s) for c in rows if c.mode == mode)
            if _base(mode) in LOCAL_MODES:  # the same at every round trip
                points = [(rtt, points[0][1]) for rtt in rtts_ms]
            style = "--" if _base(mode) in LOCAL_MODES else "-"
            axis.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=mode)
        axis.set_title(f"{kind} prompts")
        axis.set_xlabel("round-trip time (ms)")
        axis.set_ylabel("tokens/s seen by the user")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    flat[0].legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def _sum_lists(lists) -> list[int]:
    total: list[int] = []
    for values in lists:
        total.extend([0] * (len(values) - len(total)))
        for i, v in enumerate(values):
            total[i] += v
    return total


def _base(mode: str) -> str:
    """A mode's name without its layout (`auto+ahead/shared` -> `auto+ahead`)."""
    return mode.partition("/")[0]


def _mode_order(name: str) -> tuple[int, str]:
    """The modes' own order; a mode's /shared and /pinned runs side by side."""
    base, _, layout = name.partition("/")
    return (list(MODES_BY_NAME).index(base) if base in MODES_BY_NAME else len(MODES_BY_NAME)), layout


def _modes_in(cells: list[Cell]) -> list[str]:
    return sorted({c.mode for c in cells}, key=_mode_order)
