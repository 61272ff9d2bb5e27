"""Users on an emulated GPU: the default mode against server-only streams, at 1 to 64 users.

    .venv/bin/python -m benchmarks.load --emulate PROFILE [--drafter laptop-gpu-0.5b] [--rtt-ms 14]
        [--users 1,4,16,32,64] [--modes default,chain,server] [--kinds code,chat,prose,repeat] [--max-tokens 96]
        [--seconds 3] [--time-scale F] [--reply-every S | --think S] [--warm-up S] [--client-processes N]
        [--json FILE]
    .venv/bin/python -m benchmarks.load --emulate list      # the profiles, one a line

The service is the product's (remote_verify/server.py, its scheduler sharing passes between
sessions) on an emulated target: the default pair's recorded decisions (greedy; or sampled, with
`--recording` naming a sampled recording, whose sampling and seed every user asks with), each pass held
for the time the target profile gives a pass of its shape (benchmarks/emulation/). Each user is
a real client in its own thread with its own connection through the latency proxy (`--rtt-ms`, in a
process of its own: on a thread beside the users it waited for them, app/latency_proxy.py),
in the mode named, with an emulated drafter (the drafter profile; the real drafter's recorded
guesses). Past 64 users they run in worker processes of at most 64 each (`--client-processes`;
benchmarks/client_processes.py): hundreds of clients in one interpreter waited for it, and measured
their own waiting. The users arrive spread over the first half of a warm-up (a fifth of `--seconds`
unless `--warm-up` says, before the measured window; started in one instant, server-only users, all
equally fast, stayed in step, every prompt arriving with every other's), and each makes replies of `--max-tokens`
tokens, prompt after prompt from its own place in the set, for `--seconds` (emulated); every
reply finished is checked against the target's recorded path.

`--reply-every S` paces each user: users arrive spread over S emulated seconds (the warm-up is at
least S), and a reply begins S seconds after the user's last began (or when it ends, if later), so
that every mode is asked the same replies at the same times. Without it a user asks its next prompt
the moment a reply ends: a mode that finishes replies sooner is asked more prompts in the window,
and their prompts' prefills take device time the other mode never spent (the emulated 32B at 64
users, a 15-second window: the default mode began 116 replies, server-only 64), so a user's tokens
in the window compare two different loads. Paced, each user's speed over its own replies (tokens
over their time from request to last token, first token included) compares one load.

`--think S` keeps the closed loop but puts a wait between a reply's end and the user's next prompt,
S emulated seconds on average (exponential), as a person reads a reply: each user draws its waits
from its own seeded generator, so both modes wait the same. Without waits, users who all run at one
rate (server-only) keep forever the spacing they arrived with, so each of their prompts arrives
alone, while users who run at their own text's rate (the default mode) lose it within a reply and
their prompts meet: the first token then compares an evenness no users keep.

`chain` is the default mode with trees off: the chains it drafts where trees do not pay, for
comparing the two shapes where they do.

Reported per (users, mode), over that window: the aggregate tokens/s (every user's tokens
committed in the window), each user's tokens/s at p50 and p99 (the slowest 1%), the slowest
user's tokens/s over its replies begun in the window (`reply_rates`), the time to
the first token at p50 and p99 over the replies started in it (not the first wave, every
user's prompt read at once; their count beside them), how many users got 20 tokens/s
or more, the target's passes per token and tokens per pass, the guesses (tree nodes) a pass
verified, the acceptance by depth, the tree width each user's controller chose, the device's utilization (its time in passes over the
window: what is not is this machine's own overhead between passes), how late the clients' own
threads woke (the client lag, p99, over the time scale: emulated time the clients added to what they
measured; benchmarks/client_lag.py), and the replies that differ from the target's path. Beside server-only's, each mode's figures are also read on the same
replies (the same prompts, so the same text): the speed over replies both finished (`same_replies`),
the first token's p99 over replies both began (`same_first_tokens`), the slowest user's speed over
replies both finished but the first wave (`same_slowest`): under a closed loop the window's slowest user is
whoever's window held the hardest text, a different user in each mode; and a whole reply's time, request to
last token, over replies both finished in the full service (`same_reply_times`): its p99, the share of
replies slower than server-only's same reply, and the most any was.
Every figure is emulated and says so (`emulated`: the target profile's name, and the
drafter's). `--time-scale F` runs every emulated duration (passes, drafted tokens, the round
trip) F times slower and reports rates F times higher: on a machine too small for the number
of users (two cores, 64 clients), so that its own overheads stay small beside the emulated
device's times; the device's utilization says how far that worked (100%: passes back to back).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.latency_proxy import LatencyProxy
from benchmarks.client_lag import ClientLag
from benchmarks.client_processes import auto_processes, run_in_processes
from benchmarks.emulated_users import MODES, UserRecord, Users, UserSetup, WatchCuts, run_user
from benchmarks.emulation.profiles import load_drafter_profile, load_target_profile, profile_names
from benchmarks.emulation.recording import DEFAULT_RECORDING
from benchmarks import service_level
from benchmarks.paired_resampling import percentile_ratio_interval
from benchmarks.pass_trace_report import mark_window
from benchmarks.service_level import percentile
from benchmarks.emulation.serve import start_emulated_service

USERS_RATE = 20.0  # tokens/s a user should get: "users served at 20 tokens/s or more"


class SettingsError(ValueError):
    """Flags that cannot make a meaningful run, found before anything starts."""


@dataclass
class WaveRecord:
    users: int
    mode: str
    rtt_ms: float
    emulated: str  # the target profile's name (and the drafter's, in modes that draft)
    aggregate_tok_s: float
    user_p50_tok_s: float
    user_p99_tok_s: float  # the slowest 1% of users
    user_min_tok_s: float  # the slowest user
    first_token_p50_s: float
    first_token_p99_s: float
    users_at_20_tok_s: int
    passes_per_token: float
    acceptance: float
    utilization: float  # the device's time in passes over the window
    differing: int
    errors: list[str]
    time_scale: float
    tokens_per_pass: float = 0.0
    nodes_per_pass: float = 0.0  # guesses a pass verified (a tree's nodes), over passes
    # acceptance by depth d: of the passes that kept d - 1 guesses (d = 1: that verified one), the
    # share that kept a d-th
    acceptance_by_depth: list[float] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)  # each user's tree width at the end (1: chains)
    first_tokens: int = 0  # the replies begun in the window: what the first-token figures are over
    # connections the clients' ping watch cut as stalled (local_draft/ping_watch.py): on this machine, a sign
    # that the users' process could not keep up (128 users under a sampling profiler, which pauses the
    # process, cut 143), not the emulated link; the wave's figures then measure reconnects
    links_cut: int = 0
    user_rates: list[float] = field(default_factory=list)  # each user's tokens/s, slowest first
    # every finished reply as (user, reply number, wall s, tokens): the k-th reply of a user is the same
    # prompt in every mode, so two modes compare on the replies both finished (`same_replies`)
    replies: list[tuple[int, int, float, int]] = field(default_factory=list)
    # every first token of a reply begun in the window as (user, reply number, s): the same prompts in two
    # modes (`same_first_tokens`)
    first_token_by_reply: list[tuple[int, int, float]] = field(default_factory=list)
    # each user's tokens/s over its finished replies begun in the window (request to last token), slowest
    # first: a user's speed as it waits for its replies, whatever else the window held (`--reply-every`)
    reply_rates: list[float] = field(default_factory=list)
    pace_s: float = 0.0  # --reply-every (emulated s; 0: a user asks its next prompt when a reply ends)
    think_s: float = 0.0  # --think (emulated s, the mean wait between a reply's end and the next prompt)
    sampling: str = "greedy"  # the recording's: "greedy", or its temperature, top-k, top-p and seed
    # the users' processes (1: the benchmark's own), and how late their threads woke in the window, at p50,
    # p99 and at worst, over the time scale (emulated ms: time the clients, not the service, added to what
    # they measured; benchmarks/client_lag.py). The worst is what cuts links: a pong that waits 3 s (wall)
    client_processes: int = 1
    client_lag_p50_ms: float = 0.0
    client_lag_p99_ms: float = 0.0
    client_lag_max_ms: float = 0.0
    warm_up_s: float = 0.0  # emulated seconds from the users' start to the window


def run_wave(url: str, mode: str, users: int, made: Users, max_tokens: int, seconds: float, busy_seconds,
             pace_s: float = 0.0, think_s: float = 0.0, processes: int = 1,
             warm_up_s: float | None = None) -> tuple[list[UserRecord], tuple[float, float], float, int, list[float]]:
    """Every user generating for `seconds` (wall), a reply every `pace_s` (wall; 0: one after another, with
    a wait of `think_s` on average between them), in this process or split over `processes` worker processes
    (benchmarks/client_processes.py), after a warm-up of `warm_up_s` (wall; None: a fifth of `seconds`, or a
    pace if longer); returns their records, the window, the device's busy seconds in it, the links the
    clients' ping watch cut and how late the clients' threads woke in the window (s)."""
    # paced, users arrive spread over one pace (spread over less, every pace brings them back in a herd: the
    # emulated 32B's 64 prompts in two seconds of every ten), and all have begun by the window
    warm_up = warm_up_of(seconds, pace_s, warm_up_s)
    spread = pace_s or warm_up / 2
    if processes > 1:
        return run_in_processes(url, mode, users, made.setup, max_tokens, seconds, warm_up, spread, busy_seconds,
                                pace_s, think_s, processes)
    with WatchCuts() as cuts:
        lag = ClientLag().start()
        try:
            records, window, busy = _run_wave(url, mode, users, made, max_tokens, seconds, warm_up, spread,
                                              busy_seconds, pace_s, think_s)
        finally:
            lag.stop()
    return records, window, busy, cuts.count, lag.within(*window)


def warm_up_of(seconds: float, pace_s: float, warm_up_s: float | None) -> float:
    """The time from the users' start to the window: `warm_up_s`, or a fifth of `seconds`; at least a pace."""
    return max(seconds / 5 if warm_up_s is None else warm_up_s, pace_s)


def _run_wave(url: str, mode: str, users: int, made: Users, max_tokens: int, seconds: float, warm_up: float,
              spread: float, busy_seconds, pace_s: float,
              think_s: float = 0.0) -> tuple[list[UserRecord], tuple[float, float], float]:
    records = [UserRecord() for _ in range(users)]
    start = threading.Barrier(users + 1)
    window = [0.0, float("inf")]
    threads = [threading.Thread(target=run_user, args=(i, mode, url, made.draft(), made.entries, max_tokens, start,
                                                       window, records[i], spread * i / users, pace_s, think_s),
                                daemon=True)
               for i in range(users)]
    for thread in threads:
        thread.start()
    try:
        start.wait(300)
    except threading.BrokenBarrierError:
        pass
    window[0] = time.perf_counter() + warm_up  # after every user's first prompt is read
    window[1] = window[0] + seconds
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    busy0 = busy_seconds()
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    busy = busy_seconds() - busy0
    for thread in threads:
        thread.join()
    return records, (window[0], window[1]), busy


def summarize(records: list[UserRecord], window: tuple[float, float], busy_s: float, users: int, mode: str,
              rtt_ms: float, emulated: str, time_scale: float, pace_s: float = 0.0,
              lateness: list[float] = ()) -> WaveRecord:
    seconds = window[1] - window[0]
    rates = [r.tokens_in(*window) / seconds * time_scale for r in records]
    firsts = [s / time_scale for r in records for s in r.first_token_s]
    drafted = sum(r.drafted for r in records)
    passes = sum(r.passes for r in records)
    kept = [sum(r.accepted_at[i] for r in records if i < len(r.accepted_at))
            for i in range(max((len(r.accepted_at) for r in records), default=0))]
    before = [sum(r.drafting_passes for r in records)] + kept[:-1]
    by_depth = [round(k / b, 3) if b else 0.0 for k, b in zip(kept, before)]
    reply_rates = [rate * time_scale for r in records if (rate := r.reply_rate()) is not None]
    return WaveRecord(
        users=users, mode=mode, rtt_ms=rtt_ms, emulated=emulated, aggregate_tok_s=sum(rates),
        user_p50_tok_s=percentile(rates, 50), user_p99_tok_s=percentile(rates, 1), user_min_tok_s=min(rates, default=0.0),
        first_token_p50_s=percentile(firsts, 50), first_token_p99_s=percentile(firsts, 99),
        users_at_20_tok_s=sum(rate >= USERS_RATE for rate in rates),
        passes_per_token=sum(r.passes for r in records) / max(sum(r.tokens for r in records), 1),
        acceptance=sum(r.accepted for r in records) / drafted if drafted else 0.0,
        utilization=busy_s / seconds, differing=sum(len(r.differing) for r in records),
        errors=[r.error for r in records if r.error] + [d for r in records for d in r.differing][:3],
        time_scale=time_scale, tokens_per_pass=sum(r.tokens for r in records) / max(passes, 1),
        nodes_per_pass=drafted / max(passes, 1), acceptance_by_depth=by_depth[:12], widths=[r.width for r in records],
        first_tokens=len(firsts), user_rates=sorted(round(rate, 2) for rate in rates),
        replies=[(user, k, round(wall, 4), tokens) for user, r in enumerate(records) for k, wall, tokens in r.replies],
        first_token_by_reply=[(user, k, round(s / time_scale, 5)) for user, r in enumerate(records)
                              for k, s in zip(r.first_token_replies, r.first_token_s)],
        reply_rates=sorted(round(rate, 2) for rate in reply_rates), pace_s=pace_s,
        client_lag_p50_ms=percentile(list(lateness), 50) * 1000 / time_scale,
        client_lag_p99_ms=percentile(list(lateness), 99) * 1000 / time_scale,
        client_lag_max_ms=max(lateness, default=0.0) * 1000 / time_scale)


def same_replies(a: WaveRecord, b: WaveRecord) -> tuple[float, int] | None:
    """a's speed over b's on the replies both finished (the same prompts, the same text): their tokens
    over their wall time in a, against the same in b; and how many replies that is (None: none in common).
    A window's tokens/s counts whichever prompts each mode reached in it, and one user's prompts differ in
    how well they draft (2 to 6 tokens a pass on the 70B), so a mode that got one prompt further is
    measured on other text; this is measured on the same."""
    walls_b = {(user, k): (wall, tokens) for user, k, wall, tokens in b.replies}
    common = [(wall, walls_b[(user, k)][0], tokens) for user, k, wall, tokens in a.replies if (user, k) in walls_b]
    if not common:
        return None
    wall_a, wall_b = sum(c[0] for c in common), sum(c[1] for c in common)
    return (wall_b / wall_a if wall_a > 0 else 0.0), len(common)


def same_first_tokens(a: WaveRecord, b: WaveRecord) -> tuple[float, float, int] | None:
    """The first token's p99 in a and in b over the replies both began in the window (the same prompts),
    and how many that is (None: none in common). A mode that finishes replies sooner begins more in the
    window, of prompts the other may not reach (the longest, cut into pieces on a slow target), so the
    p99 over each mode's own replies compares other prompts."""
    common = _common_first_tokens(a, b)
    if not common:
        return None
    return percentile([c[0] for c in common], 99), percentile([c[1] for c in common], 99), len(common)


def same_first_tokens_interval(a: WaveRecord, b: WaveRecord) -> tuple[float, float] | None:
    """The range the ratio of `same_first_tokens`'s two p99s moves over by resampling those replies
    (benchmarks/paired_resampling.py: a floor on what one run says, not all of it); None: none in common."""
    common = _common_first_tokens(a, b)
    return percentile_ratio_interval([c[0] for c in common], [c[1] for c in common])


def _common_first_tokens(a: WaveRecord, b: WaveRecord) -> list[tuple[float, float]]:
    """(a's first token, b's) of every reply both began in the window."""
    firsts_b = {(user, k): s for user, k, s in b.first_token_by_reply}
    return [(s, firsts_b[(user, k)]) for user, k, s in a.first_token_by_reply if (user, k) in firsts_b]


def same_slowest(a: WaveRecord, b: WaveRecord) -> tuple[float, float, int, int] | None:
    """The slowest user's tokens/s in a and in b over the replies both finished, each user's first left
    out (every user's first prompt is read at once, before the window), each user's tokens over its
    replies' wall time (request to last token, first token included); and how many users and replies
    that is (None: none in common). Under a closed loop a user's k-th reply is prompt u + k in every mode,
    so a mode that finishes replies sooner spends the window on prompts the other never reached: the
    slowest user by the window's tokens is then the one whose window held the least draftable text and
    the longest prompts, not the one the service served worst. Over the same replies each user is
    measured on the same text in both modes. (Not the replies begun in the window: with few users the
    faster mode begins its window several replies further on, and none would be common.)"""
    common = ({(user, k) for user, k, _, _ in a.replies if k > 0} & {(user, k) for user, k, _, _ in b.replies})
    if not common:
        return None

    def slowest(record: WaveRecord) -> float:
        per_user: dict[int, list[float]] = {}
        for user, k, wall, tokens in record.replies:
            if (user, k) in common:
                walls = per_user.setdefault(user, [0.0, 0.0])
                walls[0], walls[1] = walls[0] + wall, walls[1] + tokens
        rates = [tokens / wall * record.time_scale for wall, tokens in per_user.values() if wall > 0]
        return min(rates, default=0.0)

    return slowest(a), slowest(b), len({user for user, _ in common}), len(common)


@dataclass
class ReplyTimes:
    """`same_reply_times`: the p99 of a whole reply's seconds in each mode, how many replies, the range the ratio
    of the two moves over by resampling them, the share of replies slower than the same reply in the other mode,
    and the most any was."""

    p99_s: float
    other_p99_s: float
    replies: int
    interval: tuple[float, float] | None
    slower: float
    worst: float


def same_reply_times(a: WaveRecord, b: WaveRecord) -> ReplyTimes | None:
    """Each reply's whole time (request to last token, first token included) in a against b, on the replies
    both finished under the full load (None: none in common). What a person waits for is the reply, and its
    first token is a few tens of ms of it: this reads a mode's first tokens and every token after them at once,
    on the same text. Left out of both: the first wave (every user's prompt at once) and each user's last
    reply in either, which ends after the window, while the others have stopped asking: server-only's last
    replies ran in a thinning service (the emulated 7B at 64 users: 2.16 s on average against 2.40 s for its
    others), and read against the same replies in the full service of a faster mode, which was further on by
    then, they made that mode look up to 1.67x slower on them where it was 1.09x at most."""
    ended = _last_replies(a) | _last_replies(b)
    walls_b = {(user, k): wall for user, k, wall, _ in b.replies if k > 0 and (user, k) not in ended}
    common = [(wall, walls_b[(user, k)]) for user, k, wall, _ in a.replies if (user, k) in walls_b]
    if not common:
        return None
    times_a = [wall / a.time_scale for wall, _ in common]
    times_b = [wall / b.time_scale for _, wall in common]
    ratios = [x / y for x, y in zip(times_a, times_b) if y > 0]
    return ReplyTimes(p99_s=percentile(times_a, 99), other_p99_s=percentile(times_b, 99), replies=len(common),
                      interval=percentile_ratio_interval(times_a, times_b),
                      slower=sum(ratio > 1.0 for ratio in ratios) / max(len(ratios), 1),
                      worst=max(ratios, default=0.0))


def _last_replies(record: WaveRecord) -> set[tuple[int, int]]:
    """(user, reply number) of each user's last reply in `record`."""
    last: dict[int, int] = {}
    for user, k, _, _ in record.replies:
        last[user] = max(last.get(user, k), k)
    return set(last.items())


def run_capacity(target_profile: str, drafter_profile: str, rtts_ms: list[float], user_counts: list[int],
                 modes: list[str], kinds: list[str], max_tokens: int, seconds: float, time_scale: float,
                 recording_path: Path = DEFAULT_RECORDING, vocab_path: Path | None = None,
                 on_record=None, thin_acceptance: float | None = None, level=None,
                 on_served=None, fair: bool = True, batch_tokens: int | None = None,
                 pace_s: float = 0.0, think_s: float = 0.0,
                 first_token_room: float | None = None, processes: int | None = None,
                 first_token_room_ms: float | None = None,
                 warm_up_s: float | None = None, trace_passes: Path | None = None) -> list[WaveRecord]:
    """Every (round trip, users, mode) wave; `vocab_path`: the GGUF of the recording's vocabulary
    (default: the default pair's draft). With `level` (a service_level.ServiceLevel), instead, per
    round trip and mode, the users served at that level, by a search over user counts from the
    first of `user_counts` up to its last (`on_served(rtt, mode, users)` is told each). `pace_s`: a user's
    replies begin that many emulated seconds apart (0: each when the last ends, after a wait of `think_s` on
    average). `first_token_room`, `first_token_room_ms`: the service's
    --first-token-room and --first-token-room-ms (None: its default). `processes`: the worker
    processes the users run in (None: benchmarks/client_processes.py `auto_processes`). `warm_up_s`: emulated
    seconds before each window (None: a fifth of `seconds`, at least a pace). `trace_passes`: the service's
    --trace-passes file (benchmarks/pass_trace_report.py reads it)."""
    from local_draft.verify_client import PING_TIMEOUT_S
    from models.registry import file_path, get_pair

    for rtt in rtts_ms:  # the clients' ping watch is not scaled: a round trip as long as it would cut every link
        if rtt / 1000 * time_scale >= PING_TIMEOUT_S / 2:
            raise SettingsError(f"--rtt-ms {rtt:g} at --time-scale {time_scale:g} is a round trip of "
                             f"{rtt / 1000 * time_scale:g} s on this machine, too close to the clients' ping timeout "
                             f"({PING_TIMEOUT_S:g} s: every link would be cut as stalled); lower --time-scale "
                             f"below {PING_TIMEOUT_S / 2 / (rtt / 1000):g}")
    load_target_profile(target_profile)  # a wrong name fails here, before anything starts
    load_drafter_profile(drafter_profile)
    pair = get_pair()
    vocab_path = vocab_path or file_path(pair, pair.draft)
    setup = UserSetup(drafter_profile, recording_path, vocab_path, tuple(kinds), time_scale, thin_acceptance)
    made = setup.load()
    recording = made.recording
    service, url = start_emulated_service(target_profile, "--replay", str(recording_path), "--vocab", str(vocab_path),
                                          "--time-scale", str(time_scale), "--max-sessions", str(max(user_counts)),
                                          "--fair-passes" if fair else "--no-fair-passes",
                                          *(("--batch-tokens", str(batch_tokens)) if batch_tokens is not None else ()),
                                          *(("--first-token-room", str(first_token_room))
                                            if first_token_room is not None else ()),
                                          *(("--first-token-room-ms", str(first_token_room_ms))
                                            if first_token_room_ms is not None else ()),
                                          *(("--trace-passes", str(trace_passes)) if trace_passes is not None else ()))
    results = []
    what_if = "what-if" in load_target_profile(target_profile).description.lower()
    try:
        for rtt in rtts_ms:
            proxy = LatencyProxy(url, rtt_ms=rtt * time_scale)
            proxy.start_in_process()  # the link must not wait on the users' threads (app/latency_proxy.py)

            def probe(users: int, mode: str) -> WaveRecord:
                workers = processes or auto_processes(users)
                records, window, busy, cut, lateness = run_wave(
                    proxy.url, mode, users, made, max_tokens, seconds * time_scale, lambda: _metric(url, BUSY),
                    pace_s * time_scale, think_s * time_scale, workers,
                    None if warm_up_s is None else warm_up_s * time_scale)
                label = target_profile if mode == "server" else f"{target_profile} + {drafter_profile}"
                if not fair and mode != "server":
                    label += " (unfair passes)"
                if thin_acceptance is not None and mode != "server":
                    label += f" (guesses thinned to {thin_acceptance:g})"
                label = f"{label} (what-if)" if what_if else label
                if trace_passes is not None:  # the report reads the window's passes, as this reads its replies
                    mark_window(trace_passes, *window, mode=mode, users=users, rtt_ms=rtt)
                record = summarize(records, window, busy, users, mode, rtt, label, time_scale, pace_s, lateness)
                record.client_processes = workers
                record.warm_up_s = warm_up_of(seconds, pace_s, warm_up_s)
                record.sampling, record.think_s = recording.sampling_said, think_s
                record.links_cut = cut
                if cut:
                    record.errors.insert(0, f"{cut} links cut as stalled by the clients' ping watch: this machine "
                                            f"could not keep up with {users} users; raise --time-scale (the round "
                                            f"trip, scaled too, must stay well under the ping timeout)")
                results.append(record)
                if on_record is not None:
                    on_record(record)
                return record

            try:
                if level is not None:  # the users served at the level, per mode, by a search over counts
                    for mode in modes:
                        served, _ = service_level.search(lambda users: probe(users, mode), level,
                                                         start=user_counts[0], limit=user_counts[-1])
                        if on_served is not None:
                            on_served(rtt, mode, served)
                    continue
                for users in user_counts:
                    for mode in modes:
                        probe(users, mode)
            finally:
                proxy.stop()
    finally:
        service.terminate()
        service.wait(timeout=60)
    return results


BUSY = "specwire_target_busy_seconds"


def _metric(url: str, name: str) -> float:
    """One unlabelled sample of the service's /metrics."""
    import urllib.request

    with urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(name)


def first_token_said(record: WaveRecord) -> str:
    if not record.first_tokens:
        return "unmeasured (no reply began in the window: lengthen --seconds)"
    return f"{record.first_token_p99_s:.3f} s over {record.first_tokens} replies"


def print_records(records: list[WaveRecord]) -> None:
    print("EMULATED device (every figure below): target and drafter profiles as named; tokens/s per user "
          "and aggregate; first token in s")
    print("| emulated | rtt ms | users | mode | aggregate tok/s | user p50 | user p99 (slowest) | first token p50 / p99 s "
          "(replies) | users >= 20 tok/s | passes/token | tokens/pass | nodes/pass | acceptance | by depth 1-4 | width "
          "| device busy | client lag p99 / max ms (processes) | differing |")
    print("|---" * 18 + "|")
    for r in records:
        depths = " / ".join(f"{a:.2f}" for a in r.acceptance_by_depth[:4])
        width = "-" if r.mode == "server" else ",".join(str(w) for w in sorted(set(r.widths)))
        print(f"| {r.emulated} | {r.rtt_ms:g} | {r.users} | {r.mode} | {r.aggregate_tok_s:.1f} | {r.user_p50_tok_s:.1f} | "
              f"{r.user_p99_tok_s:.1f} | {r.first_token_p50_s:.3f} / {r.first_token_p99_s:.3f} ({r.first_tokens}) | {r.users_at_20_tok_s} | "
              f"{r.passes_per_token:.2f} | {r.tokens_per_pass:.2f} | {r.nodes_per_pass:.1f} | {r.acceptance:.2f} | "
              f"{depths} | {width} | {r.utilization:.0%} | {r.client_lag_p99_ms:.2f} / {r.client_lag_max_ms:.1f} ({r.client_processes}) | {r.differing} |")
    by_key = {(r.rtt_ms, r.users, r.mode): r for r in records}
    for (rtt, users, mode), r in by_key.items():
        server = by_key.get((rtt, users, "server"))
        chain = by_key.get((rtt, users, "chain"))
        if mode != "chain" and mode != "server" and chain is not None and chain.aggregate_tok_s:
            same = same_replies(r, chain)
            print(f"  {rtt:g} ms, {users} users, {mode} / chain: aggregate x{r.aggregate_tok_s / chain.aggregate_tok_s:.2f}"
                  + (f", on the same {same[1]} replies x{same[0]:.2f}" if same else ""))
        if mode != "server" and server is not None and server.aggregate_tok_s:
            print(f"  {rtt:g} ms, {users} users, {mode} / server: aggregate x{r.aggregate_tok_s / server.aggregate_tok_s:.2f}, "
                  f"user p50 x{r.user_p50_tok_s / max(server.user_p50_tok_s, 1e-9):.2f}, users at 20 tok/s "
                  f"{r.users_at_20_tok_s} vs {server.users_at_20_tok_s}"
                  + (f", on the same {same[1]} replies x{same[0]:.2f}" if (same := same_replies(r, server)) else "")
                  + (f"; first token p99 on the same {firsts[2]} replies {firsts[0]:.3f} s against {firsts[1]:.3f}"
                     + (f" (x{firsts[0] / firsts[1]:.2f}, {interval[0]:.2f} to {interval[1]:.2f} by resampling them)"
                        if firsts[1] > 0 and (interval := same_first_tokens_interval(r, server)) else "")
                     if (firsts := same_first_tokens(r, server)) else "")
                  + (f"; the slowest user on the same {slow[3]} replies of {slow[2]} users {slow[0]:.1f} tok/s "
                     f"against {slow[1]:.1f} (x{slow[0] / slow[1]:.2f})"
                     if (slow := same_slowest(r, server)) and slow[1] > 0 else "")
                  + (f"; a whole reply p99 on the same {whole.replies} replies {whole.p99_s:.3f} s against "
                     f"{whole.other_p99_s:.3f} (x{whole.p99_s / whole.other_p99_s:.2f}"
                     + (f", {whole.interval[0]:.2f} to {whole.interval[1]:.2f}" if whole.interval else "")
                     + f"), {whole.slower:.0%} of them slower than server-only's, x{whole.worst:.2f} at most"
                     if (whole := same_reply_times(r, server)) and whole.other_p99_s > 0 else "")
                  + (f"; the slowest user over its replies {r.reply_rates[0]:.1f} tok/s against "
                     f"{server.reply_rates[0]:.1f} (x{r.reply_rates[0] / server.reply_rates[0]:.2f})"
                     if r.reply_rates and server.reply_rates else ""))
    for r in records:
        for error in r.errors:
            print(f"  {r.users} {r.mode}: {error}")


def print_served(profile: str, served: list[tuple[float, str, int]], level, limit: int, pace_s: float = 0.0) -> None:
    paced = f"; users paced a reply every {pace_s:g} s, read over their replies" if pace_s else ""
    print(f"EMULATED: users served at the service level ({level.describe()}{paced}), {profile}")
    print("| emulated | rtt ms | mode | users served |")
    print("|---|---|---|---|")
    for rtt, mode, users in served:
        print(f"| {profile} | {rtt:g} | {mode} | {users}{'+' if users >= limit else ''} |")
    by_rtt: dict[float, dict[str, int]] = {}
    for rtt, mode, users in served:
        by_rtt.setdefault(rtt, {})[mode] = users
    for rtt, modes in by_rtt.items():
        if modes.get("server") and "default" in modes:
            print(f"  {rtt:g} ms: default / server users served x{modes['default'] / modes['server']:.2f}")


def add_arguments(parser) -> None:
    group = parser.add_argument_group("emulated device (--emulate)")
    group.add_argument("--emulate", metavar="PROFILE", help="instead: users on an emulated target (a target "
                       "profile of benchmarks/emulation/profiles; `list` prints them)")
    group.add_argument("--drafter", default="laptop-gpu-0.5b", help="with --emulate: the users' drafter profile")
    group.add_argument("--users", default="1,4,16,32,64", help="with --emulate: user counts, comma-separated")
    group.add_argument("--rtt-ms", default="14", help="with --emulate: round trips, comma-separated (ms)")
    group.add_argument("--modes", default="default,server", help=f"with --emulate: among {', '.join(MODES)}")
    group.add_argument("--kinds", default="code,chat,prose,repeat", help="with --emulate: prompt kinds")
    group.add_argument("--seconds", type=float, default=3.0,
                       help="with --emulate: how long (emulated seconds) each (users, mode) is measured")
    group.add_argument("--recording", type=Path, default=DEFAULT_RECORDING,
                       help="with --emulate: the recorded decisions to replay (default: the default pair's)")
    group.add_argument("--vocab", type=Path, help="with --emulate: the GGUF of the recording's vocabulary "
                       "(default: the default pair's draft)")
    group.add_argument("--thin-acceptance", type=float, metavar="A",
                       help="with --emulate: the drafters' guesses thinned so that a first guess is right A of the "
                       "time (a small drafter against a much larger target; the target's paths are the same)")
    group.add_argument("--fair-passes", action=argparse.BooleanOptionalAction, default=True,
                       help="with --emulate: the service's --fair-passes, its default (guesses only as every "
                       "member's ledger allows); --no-fair-passes: by the pass's goodput alone")
    group.add_argument("--first-token-room", type=float, metavar="R",
                       help="with --emulate: the service's --first-token-room (default: the service's own)")
    group.add_argument("--first-token-room-ms", type=float, metavar="MS",
                       help="with --emulate: the service's --first-token-room-ms, in the emulated device's ms "
                       "(default: the service's own; inf: none)")
    group.add_argument("--trace-passes", type=Path, metavar="FILE",
                       help="with --emulate: the service writes every pass to FILE (specwire serve --trace-passes); "
                       "python -m benchmarks.pass_trace_report FILE --time-scale F reads it (a mode a run: the file "
                       "holds every wave's passes, warm-ups too; each wave's measured window is marked in it, and "
                       "the report reads those)")
    group.add_argument("--capacity", action="store_true",
                       help="with --emulate: instead of every count in --users, the users served at the service "
                       "level per round trip and mode, searched from the first count in --users (doubling, "
                       "then halving the gap twice) up to the last")
    group.add_argument("--level-tok-s", type=float, default=30.0,
                       help="with --capacity: the users' tokens/s at --level-users at least this (default 30; "
                       "with --reply-every, over each user's replies)")
    group.add_argument("--level-users", type=float, default=50.0, metavar="P",
                       help="with --capacity: the percentile of the users that must reach --level-tok-s "
                       "(default 50: the median user; 0: every user, the slowest)")
    group.add_argument("--level-first-token-s", type=float, default=1.0,
                       help="with --capacity: the first token's p99 at most this, in s (default 1)")
    group.add_argument("--reply-every", type=float, default=0.0, metavar="S",
                       help="with --emulate: each user begins a reply S emulated seconds after its last began (when "
                       "it ends, if later): every mode asked the same replies at the same times (default 0: the "
                       "next prompt as soon as a reply ends)")
    group.add_argument("--think", type=float, default=0.0, metavar="S",
                       help="with --emulate: after each reply a user waits S emulated seconds on average (exponential, "
                       "its own seeded draws: the same waits in every mode) before its next prompt, as a person reads "
                       "a reply (default 0: at once). Without waits, users who all run at one rate (server-only) keep "
                       "the spacing they arrived with, and each prompt arrives alone")
    group.add_argument("--time-scale", type=float, default=1.0,
                       help="with --emulate: every emulated duration this many times longer, rates reported back")
    group.add_argument("--warm-up", type=float, metavar="S",
                       help="with --emulate: emulated seconds from the users' start to the measured window "
                       "(default: a fifth of --seconds, and at least --reply-every). The service learns a paced "
                       "user's schedule from its third reply: a window that opens sooner measures that learning, "
                       "not the steady state a service runs in")
    group.add_argument("--client-processes", type=int, metavar="N",
                       help="with --emulate: the processes the users run in (default: the benchmark's own up to "
                       "64 users, else one for every 64): hundreds of clients in one process wait for its "
                       "interpreter, and the table's client lag says how long")


def main_emulated(args) -> None:
    if args.emulate == "list":
        for name in profile_names():
            print(name)
        return
    if args.think < 0 or (args.think and args.reply_every):
        raise SystemExit("--think is the mean emulated seconds a user waits between a reply and its next prompt, 0 or "
                         f"more, and paced users (--reply-every) have their own times; got --think {args.think:g}"
                         f"{f' with --reply-every {args.reply_every:g}' if args.reply_every else ''}")
    if args.warm_up is not None and not args.warm_up >= 0:
        raise SystemExit(f"--warm-up is emulated seconds before the measured window, 0 or more; got {args.warm_up:g}")
    if args.client_processes is not None and args.client_processes < 1:
        raise SystemExit(f"--client-processes is how many processes the users run in, 1 or more; got "
                         f"{args.client_processes}")
    if args.reply_every < 0:
        raise SystemExit(f"--reply-every is the emulated seconds between a user's replies, 0 or more; got {args.reply_every:g}")
    if not 0 <= args.level_users <= 100:
        raise SystemExit(f"--level-users is a percentile of the users, 0 (every user) to 100; got {args.level_users:g}")
    level = service_level.ServiceLevel(args.level_tok_s, args.level_first_token_s, args.level_users) \
        if args.capacity else None
    served: list[tuple[float, str, int]] = []
    users = sorted(int(u) for u in args.users.split(","))
    records = run_capacity(args.emulate, args.drafter, [float(r) for r in args.rtt_ms.split(",")],
                           users, args.modes.split(","), args.kinds.split(","),
                           args.max_tokens, args.seconds, args.time_scale, args.recording, args.vocab,
                           on_record=lambda r: print(f"  {r.rtt_ms:g} ms {r.users} users {r.mode}: "
                                                     f"{r.aggregate_tok_s:.1f} tok/s aggregate, user p50 "
                                                     f"{r.user_p50_tok_s:.1f}, slowest user "
                                                     f"{r.user_min_tok_s:.1f}, slowest over its replies "
                                                     f"{f'{r.reply_rates[0]:.1f}' if r.reply_rates else 'none finished'}"
                                                     f", first token p99 "
                                                     f"{first_token_said(r)} (emulated)", flush=True),
                           thin_acceptance=args.thin_acceptance, level=level,
                           on_served=lambda rtt, mode, n: served.append((rtt, mode, n)), fair=args.fair_passes,
                           batch_tokens=args.batch_tokens, pace_s=args.reply_every, think_s=args.think,
                           first_token_room=args.first_token_room, processes=args.client_processes,
                           first_token_room_ms=args.first_token_room_ms,
                           warm_up_s=args.warm_up, trace_passes=args.trace_passes)
    print_records(records)
    if level is not None:
        print_served(args.emulate, served, level, users[-1], args.reply_every)
    if args.json:
        text = json.dumps([asdict(r) for r in records], indent=1) + "\n"
        if args.json == "-":
            print(text, end="")
        else:
            Path(args.json).write_text(text)
