"""The emulated device: sourced profiles, the replay of recorded decisions, sleeping passes, users."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.emulation.profiles import (
    PROFILES_DIR, DrafterProfile, ProfileError, TargetProfile, load_profile, profile_names,
)
from benchmarks.emulation.recording import DEFAULT_RECORDING, Recording
from benchmarks.pass_trace_report import read, read_windows
from app.bench.prompts import PROMPTS
from tests.conftest import RunningService, hello_for
from wire.protocol import SamplingParams

REPO = Path(__file__).resolve().parents[2]


def test_every_profile_loads_and_names_a_source_for_each_figure():
    """Each shipped profile is a target or a drafter profile, and its [sources] cover its figures."""
    names = profile_names()
    assert {"a100-qwen2.5-1.5b", "a100-qwen2.5-7b", "laptop-gpu-0.5b"} <= set(names)
    for name in names:
        profile = load_profile(name)
        figures = {"pass_ms", "session_ms", "context_ms_per_ktoken"} if isinstance(profile, TargetProfile) else \
            {"token_ms", "prefill_ms_per_token"}
        assert figures <= set(profile.sources), (name, figures - set(profile.sources))


def test_a_target_profile_prices_a_pass_by_its_shape():
    """c(tokens, sessions, context): interpolated between points, more sessions and context cost more."""
    profile = load_profile("a100-qwen2.5-1.5b")
    assert profile.pass_ms(1) == pytest.approx(5.5)
    assert profile.pass_ms(1) < profile.pass_ms(64) < profile.pass_ms(64, sessions=32) < \
        profile.pass_ms(64, sessions=32, context_tokens=32_000)
    assert profile.pass_ms(16) / profile.pass_ms(1) < 1.1  # a GPU pass of 16 costs about one


def test_a_drafter_profile_prices_a_level_of_branches_by_its_sourced_batch_cost():
    """laptop CUDA: 8 branches 1.6x one; Apple Metal: 4 branches 2.1x; a profile without a curve: b x."""
    gpu, metal = load_profile("laptop-gpu-0.5b"), load_profile("apple-m5-0.5b")
    assert gpu.batch_cost(1) == 1.0 and gpu.batch_cost(8) == pytest.approx(1.6)
    assert metal.batch_cost(4) == pytest.approx(2.1) and metal.level_ms(4) == pytest.approx(2.1 * metal.token_ms)
    assert "batch_cost" in gpu.sources and "batch_cost" in metal.sources
    bound = load_profile("free-branches-0.5b")  # the bound: the laptop drafter, its branches free
    assert bound.token_ms == gpu.token_ms and bound.prefill_ms_per_token == gpu.prefill_ms_per_token
    assert bound.level_ms(8) == bound.level_ms(32) == bound.token_ms
    assert DrafterProfile(name="plain", token_ms=1.0, prefill_ms_per_token=1.0).batch_cost(4) == 4.0


def test_an_unknown_or_malformed_profile_is_a_clear_error(tmp_path):
    """A wrong name lists the profiles; a file without its figures says what is missing."""
    with pytest.raises(ProfileError, match="a100-qwen2.5-1.5b"):
        load_profile("no-such-gpu")
    broken = tmp_path / "broken.toml"
    broken.write_text('kind = "target"\nname = "broken"\n')
    with pytest.raises(ProfileError, match="pass_ms"):
        load_profile(broken)


def test_the_load_benchmark_names_the_drafter_profiles_for_a_misspelt_one():
    """`benchmarks.load --emulate T --drafter NAME` with a name that is no profile: a usage error listing
    the profiles, not a traceback, before anything starts."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.load", "--emulate", "h100x2-70b-fp8", "--drafter",
                           "laptop-gpu", "--users", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "no device profile 'laptop-gpu'" in done.stderr and "laptop-gpu-0.5b" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_round_trip_scaled_past_the_clients_ping_watch_is_refused_before_anything_starts():
    """`--rtt-ms 100 --time-scale 30` scales the round trip to 3 s, the clients' ping timeout: every link
    would be cut as stalled and the wave measure nothing (seen: 64 users, 0 tokens/s). A usage error
    saying which time scale works, not a run."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.load", "--emulate", "h100x2-70b-fp8", "--users", "1",
                           "--rtt-ms", "14,100", "--time-scale", "30"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "--rtt-ms 100 at --time-scale 30" in done.stderr and "lower --time-scale below 15" in done.stderr, \
        done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_the_shipped_recording_covers_the_default_prompt_set():
    """Every prompt of the default set has a recorded path and a guess for each of its positions."""
    recording = Recording.load(DEFAULT_RECORDING)
    texts = {entry.text for entry in recording.entries}
    assert texts == {text for texts in PROMPTS.values() for text in texts}
    for entry in recording.entries:
        assert len(entry.guesses) == len(entry.path) >= 96 and entry.stop in ("eos", "max_tokens")
    right = sum(g == t for e in recording.entries for g, t in zip(e.guesses, e.path))
    assert 0.6 < right / sum(len(e.path) for e in recording.entries) < 0.99  # a real pair: often, not always right


@pytest.fixture(scope="module")
def tiny_recording(tiny, tmp_path_factory) -> Path:
    """The tiny pair's decisions on the default prompt set, recorded as the default pair's are."""
    from benchmarks.emulation.record import record

    path = tmp_path_factory.mktemp("recording") / "tiny.json"
    record(tiny.draft, tiny.target_gguf, 48).save(path)
    return path


def test_the_replay_streams_the_recorded_path_and_the_real_target_agrees(tiny, tiny_recording, close_draft,
                                                                       own_llamacpp_target):
    """Through the real service, the replayed target streams each prompt's recorded path, which is
    what the real tiny target streams."""
    from benchmarks.emulation.profiles import load_target_profile
    from benchmarks.emulation.target import EmulatedTarget, ReplayTarget
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.verify_client import VerifyClient

    recording = Recording.load(tiny_recording)
    replay = RunningService(EmulatedTarget(ReplayTarget(recording, tiny.draft), load_target_profile("a100-qwen2.5-1.5b")))
    real = RunningService(own_llamacpp_target)
    try:
        for url in (replay.url, real.url):
            client = VerifyClient(url, hello_for(close_draft))
            streamed = ServerOnlyGenerator(client, close_draft.end_ids)
            for entry in recording.entries[:4]:
                assert streamed.generate(entry.prompt, 48).token_ids == entry.path
            client.close()
    finally:
        replay.close()
        real.close()


def test_an_emulated_pass_sleeps_for_its_profile_time(tiny, tiny_recording):
    """A pass priced at 80 ms takes at least that long and costs the process almost no CPU."""
    from benchmarks.emulation.target import EmulatedTarget, ReplayTarget

    slow = TargetProfile(name="slow", pass_points=((1, 80.0), (8, 80.0)))
    target = EmulatedTarget(ReplayTarget(Recording.load(tiny_recording), tiny.draft), slow)
    entry = Recording.load(tiny_recording).entries[0]
    cache = target.new_cache()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(5):
        target.forward(cache, entry.prompt if cache.length == 0 else [entry.path[0]], 1)
        target.truncate(cache, len(entry.prompt))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 5 * 0.080 and cpu < 0.25 * wall, (wall, cpu)


def test_an_emulated_drafter_charges_the_profile_and_guesses_the_recorded_tokens(tiny, tiny_recording):
    """Reading a prompt costs its prefill time, each guess a decode step; the guesses are the recorded ones."""
    from benchmarks.emulation.drafter import EmulatedDraft
    from local_draft.draft_model import DraftModel
    from wire.protocol import SamplingParams

    recording = Recording.load(tiny_recording)
    profile = DrafterProfile(name="slow-drafter", token_ms=20.0, prefill_ms_per_token=10.0)
    draft = EmulatedDraft(DraftModel(tiny.draft, vocab_only=True), profile, recording)
    entry = recording.entries[1]
    began = time.perf_counter()
    draft.keep_up(entry.prompt)
    read = time.perf_counter() - began
    assert read >= len(entry.prompt) * 0.010 * 0.95
    began = time.perf_counter()
    guesses = [draft.guess(entry.prompt + entry.path[:i], SamplingParams(), None) for i in range(5)]
    assert time.perf_counter() - began >= 5 * 0.020 * 0.95
    assert guesses == entry.guesses[:5]


def test_an_emulated_drafter_branches_into_the_recorded_top_guesses(tiny, tiny_recording):
    """A level of branches costs the profile's step of that many sequences; each branch on the
    target's path gets the recorded top guesses, the first of them the recorded guess."""
    from benchmarks.emulation.drafter import EmulatedDraft
    from local_draft.draft_model import DraftModel

    recording = Recording.load(tiny_recording)
    profile = DrafterProfile(name="cuda-like", token_ms=20.0, prefill_ms_per_token=10.0, batch_points=((8, 1.6),))
    draft = EmulatedDraft(DraftModel(tiny.draft, vocab_only=True), profile, recording)
    entry = recording.entries[0]
    assert len(entry.top) == len(entry.path) and all(top[0][0] == g for top, g in zip(entry.top, entry.guesses))
    draft.keep_up(entry.prompt)
    began = time.perf_counter()
    paths = [tuple(entry.path[:1]), (entry.top[0][1][0],)] + [(entry.path[0], t) for t in range(6)]
    options = draft.branch_guesses(entry.prompt, paths, SamplingParams(), lambda position: None)
    assert time.perf_counter() - began >= 20.0 * 1.6 / 1000 * 0.95
    assert [(t, pytest.approx(p)) for t, p in options[0]] == [tuple(x) for x in entry.top[1]]
    # off the path: the path's candidates at that position stand in (as sure as the drafter was there)
    assert [(t, pytest.approx(p)) for t, p in options[1]] == [tuple(x) for x in entry.top[1]]


def test_an_emulated_tree_level_after_a_frame_decodes_the_committed_tokens_in_its_own_batch(tiny, tiny_recording):
    """As the real drafter re-roots its branches below the committed tokens (local_draft/draft_model.py
    `_reroot`), the first level after a frame decodes, in its own batch, the committed tokens no branch
    decoded (at least the newest): it costs a level of that many more sequences, not a catch-up's read
    and then a level. A text the branches did not grow from is read first, as before."""
    from benchmarks.emulation.drafter import EmulatedDraft
    from local_draft.draft_model import DraftModel

    recording = Recording.load(tiny_recording)
    profile = DrafterProfile(name="cuda-like", token_ms=20.0, prefill_ms_per_token=10.0, batch_points=((8, 1.6),))
    draft = EmulatedDraft(DraftModel(tiny.draft, vocab_only=True), profile, recording)
    spent: list[float] = []
    draft._spend = spent.append  # the emulated milliseconds each step costs, instead of sleeping them
    entry = recording.entries[0]
    prompt, path, top = list(entry.prompt), list(entry.path), entry.top
    draft.keep_up(prompt)
    draft.branch_guesses(prompt, [(path[0],), (top[0][1][0],)], SamplingParams(), lambda position: None)
    assert spent[-1] == pytest.approx(profile.level_ms(2))
    spent.clear()  # the stream took path[0] (a branch decoded it) and its own token path[1]
    draft.branch_guesses(prompt + path[:2], [(), (path[2],)], SamplingParams(), lambda position: None)
    assert spent == [pytest.approx(profile.level_ms(1 + 1))]  # one branch, and the newest token
    spent.clear()  # three committed tokens, the first on a branch: the other two in the batch
    draft.branch_guesses(prompt + path[:5], [()], SamplingParams(), lambda position: None)
    assert spent == [pytest.approx(profile.level_ms(2))]
    spent.clear()  # three more, none on a branch (the text's level grows no branch): all three
    draft.branch_guesses(prompt + path[:8], [()], SamplingParams(), lambda position: None)
    assert spent == [pytest.approx(profile.level_ms(3))]
    spent.clear()  # another text: read first
    draft.branch_guesses(prompt + path[:3], [()], SamplingParams(), lambda position: None)
    assert spent == [pytest.approx(profile.token_ms), 0.0]


def test_the_capacity_benchmark_writes_labelled_records(tiny, tiny_recording, tmp_path):
    """`benchmarks.load --emulate` at 1 and 2 users: one JSON record per (users, mode), each saying
    it is emulated and by which profile, every reply the recorded path; with `--trace-passes`, each wave's
    measured window is marked in the service's trace, where the report reads it."""
    out, trace = tmp_path / "capacity.json", tmp_path / "passes.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.load", "--emulate", "a100-qwen2.5-1.5b", "--drafter", "laptop-gpu-0.5b",
         "--users", "1,2", "--rtt-ms", "14", "--modes", "default,server", "--kinds", "code,prose",
         "--max-tokens", "24", "--seconds", "1", "--recording", str(tiny_recording), "--vocab", str(tiny.draft),
         "--json", str(out), "--trace-passes", str(trace)], capture_output=True, text=True, cwd=REPO, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "EMULATED" in done.stdout
    records = json.loads(out.read_text())
    assert [(r["users"], r["mode"]) for r in records] == [(1, "default"), (1, "server"), (2, "default"), (2, "server")]
    for record in records:
        assert {"users", "mode", "aggregate_tok_s", "user_p50_tok_s", "users_at_20_tok_s", "emulated"} <= set(record)
        assert record["emulated"].startswith("a100-qwen2.5-1.5b") and record["differing"] == 0, record
        assert record["errors"] == [], record  # a user that failed counts no tokens: say why
        assert record["aggregate_tok_s"] > 0
    windows = read_windows(trace)
    assert len(windows) == 4 and all(later[0] >= earlier[1] for earlier, later in zip(windows, windows[1:]))
    assert all(end - start == pytest.approx(1.0) for start, end in windows)  # --seconds 1, at a time scale of 1
    passes = read(trace)  # on the service's clock: each window holds passes of its wave
    assert all(any(start <= each.began < end for each in passes) for start, end in windows), (windows, passes[:3])
    listed = subprocess.run([sys.executable, "-m", "benchmarks.load", "--emulate", "list"], capture_output=True,
                            text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert listed.stdout.split() == profile_names()


def test_users_split_over_worker_processes_finish_the_recorded_paths(tiny, tiny_recording, tmp_path):
    """`--client-processes 2`: three users dealt to two worker processes, each its own interpreter, all
    finish replies along the recorded path, every user's record comes back, and the record says how many
    processes ran them and how late their threads woke (the processes' own watch)."""
    out = tmp_path / "processes.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.load", "--emulate", "a100-qwen2.5-1.5b", "--users", "3", "--rtt-ms", "14",
         "--modes", "default", "--kinds", "code,prose", "--max-tokens", "16", "--seconds", "1", "--warm-up", "0.5",
         "--client-processes", "2", "--recording", str(tiny_recording), "--vocab", str(tiny.draft),
         "--json", str(out)], capture_output=True, text=True, cwd=REPO, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    [record] = json.loads(out.read_text())
    assert record["errors"] == [] and record["differing"] == 0, record
    assert record["client_processes"] == 2 and record["warm_up_s"] == 0.5
    assert len(record["user_rates"]) == 3 and min(record["user_rates"]) > 0, record["user_rates"]
    assert {user for user, _, _, _ in record["replies"]} == {0, 1, 2}
    assert record["client_lag_max_ms"] >= record["client_lag_p99_ms"] > 0  # a sleep always wakes a little late
    for flags, said in ((["--client-processes", "0"], "--client-processes is how many processes"),
                        (["--warm-up", "-1"], "--warm-up is emulated seconds")):
        refused = subprocess.run([sys.executable, "-m", "benchmarks.load", "--emulate", "a100-qwen2.5-1.5b", *flags],
                                 capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert refused.returncode != 0 and said in refused.stderr, refused.stderr


def test_paced_users_begin_a_reply_every_so_often_and_their_speed_over_replies_is_reported(tiny, tiny_recording,
                                                                                          tmp_path):
    """`--reply-every 0.5`: a user's replies of 8 tokens (a few dozen ms each here; without it, two dozen or
    more begin in the window) begin half a second apart, so the 2-second window holds three to five (four on
    time; a 1-second window held one, not two, once while the suite's other tests took both cores); its
    speed over them is its replies' tokens over their time."""
    out = tmp_path / "paced.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.load", "--emulate", "a100-qwen2.5-1.5b", "--users", "1", "--rtt-ms", "14",
         "--modes", "server", "--kinds", "code", "--max-tokens", "8", "--seconds", "2", "--reply-every", "0.5",
         "--recording", str(tiny_recording), "--vocab", str(tiny.draft), "--json", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    [record] = json.loads(out.read_text())
    assert record["pace_s"] == 0.5 and record["errors"] == [], record
    assert 3 <= record["first_tokens"] <= 5, record["first_tokens"]
    began = {k for _, k, _ in record["first_token_by_reply"]}
    walls = [(wall, tokens) for _, k, wall, tokens in record["replies"] if k in began]
    assert record["reply_rates"] == [pytest.approx(sum(t for _, t in walls) / sum(w for w, _ in walls), rel=0.01)]


def test_users_who_think_between_replies_ask_fewer_and_a_think_with_a_pace_is_refused(tiny, tiny_recording,
                                                                                      tmp_path):
    """`--think 0.25`: a user waits a quarter of a second on average after each reply of 8 tokens (a
    few dozen ms each here; without waits a dozen or more begin in the 1-second window), so the window
    holds a handful; with `--reply-every` as well the run stops at once and says why."""
    out = tmp_path / "think.json"
    run = [sys.executable, "-m", "benchmarks.load", "--emulate", "a100-qwen2.5-1.5b", "--users", "1", "--rtt-ms", "14",
           "--modes", "server", "--kinds", "code", "--max-tokens", "8", "--seconds", "1",
           "--recording", str(tiny_recording), "--vocab", str(tiny.draft)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(run + ["--think", "0.25", "--json", str(out)], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    [record] = json.loads(out.read_text())
    assert record["think_s"] == 0.25 and record["errors"] == [], record
    assert 1 <= record["first_tokens"] <= 9, record["first_tokens"]
    both = subprocess.run(run + ["--think", "1", "--reply-every", "1"], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=env)
    assert both.returncode != 0 and "--reply-every" in both.stderr and "Traceback" not in both.stderr, both.stderr


SAMPLED = SamplingParams(temperature=0.8)
SAMPLED_SEED = 11


@pytest.fixture(scope="module")
def tiny_sampled_recording(tiny, tmp_path_factory) -> Path:
    """The tiny pair's decisions at T 0.8 under seed 11, recorded as the default pair's at T 0.7 are."""
    from benchmarks.emulation.record import record

    path = tmp_path_factory.mktemp("recording") / "tiny-sampled.json"
    record(tiny.draft, tiny.target_gguf, 32, params=SAMPLED, seed=SAMPLED_SEED).save(path)
    return path


def test_a_sampled_recording_is_the_real_targets_text_under_its_seed(tiny, tiny_recording, tiny_sampled_recording,
                                                                    close_draft, own_llamacpp_target):
    """A recording made at T 0.8 says so, holds another text than the greedy one, and is what the real
    tiny target streams when asked with its sampling and seed (with another seed, not)."""
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.verify_client import VerifyClient

    sampled, greedy = Recording.load(tiny_sampled_recording), Recording.load(tiny_recording)
    assert sampled.params == SAMPLED and sampled.seed == SAMPLED_SEED and greedy.params.greedy
    assert sum(s.path != g.path[:len(s.path)] for s, g in zip(sampled.entries, greedy.entries)) >= 3
    assert all(top[0][0] == guess for e in sampled.entries for top, guess in zip(e.top, e.guesses))
    # each guess is the drafter's race winner over the seed's clocks there, as a drafter guesses in a stream
    from local_draft.draft_model import DraftModel
    from wire.randomness import DecisionRandomness

    drafter, randomness = DraftModel(tiny.draft), DecisionRandomness(SAMPLED_SEED)
    entry = sampled.entries[0]
    contexts = [entry.prompt + entry.path[:i] for i in range(12)]
    assert [drafter.guess(c, SAMPLED, randomness.race(len(c), drafter.vocab_size)) for c in contexts] \
        == entry.guesses[:12]
    real = RunningService(own_llamacpp_target)
    try:
        for seed, same in ((SAMPLED_SEED, True), (SAMPLED_SEED + 1, False)):
            client = VerifyClient(real.url, close_draft.hello(SAMPLED, seed=seed))
            streamed = ServerOnlyGenerator(client, close_draft.end_ids)
            paths = [streamed.generate(entry.prompt, 32).token_ids for entry in sampled.entries[:4]]
            client.close()
            assert (paths == [entry.path for entry in sampled.entries[:4]]) == same
    finally:
        real.close()


def test_a_sampled_recording_replays_in_chains_and_trees_and_refuses_other_sampling(tiny, tiny_sampled_recording,
                                                                                  tmp_path):
    """`benchmarks.load --emulate --recording` on a sampled recording: its users ask with its sampling
    and seed, every reply of chains, pinned trees and the default mode is the recorded text, guesses
    are kept, and the record says how it sampled. A drafter asked greedily of it is refused."""
    from benchmarks.emulation.drafter import EmulatedDraft
    from benchmarks.emulation.profiles import load_drafter_profile
    from benchmarks.emulation.target import ReplayError
    from local_draft.draft_model import DraftModel

    out = tmp_path / "sampled.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.load", "--emulate", "a100-qwen2.5-1.5b", "--users", "1", "--rtt-ms", "14",
         "--modes", "chain,trees4,default", "--kinds", "code,prose", "--max-tokens", "24", "--seconds", "1",
         "--recording", str(tiny_sampled_recording), "--vocab", str(tiny.draft), "--json", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    records = json.loads(out.read_text())
    assert [r["mode"] for r in records] == ["chain", "trees4", "default"]
    for record in records:
        assert record["errors"] == [] and record["differing"] == 0, record
        assert record["sampling"] == "T 0.8, top-k 0, top-p 1, seed 11", record["sampling"]
        assert record["tokens_per_pass"] > 1.0, record  # guesses were verified, and some kept
    recording = Recording.load(tiny_sampled_recording)
    draft = EmulatedDraft(DraftModel(tiny.draft, vocab_only=True), load_drafter_profile("laptop-gpu-0.5b"), recording)
    entry = recording.entries[0]
    assert draft.guess(entry.prompt, SAMPLED, None) == entry.guesses[0]
    with pytest.raises(ReplayError, match="the recording is sampled"):
        draft.guess(entry.prompt, SamplingParams(), None)


def test_the_replay_walks_trees_of_guesses_as_the_real_target_would(tiny, tiny_recording):
    """Trees built from a recorded path (right tokens as later children) through the real service on
    the replay: the stream is the recorded path, and the right branches are kept."""
    from benchmarks.emulation.profiles import load_target_profile
    from benchmarks.emulation.target import EmulatedTarget, ReplayTarget
    from tests.remote_verify.test_tree_drafts import TOKENS, stream_with_trees

    recording = Recording.load(tiny_recording)
    replay = RunningService(EmulatedTarget(ReplayTarget(recording, tiny.draft), load_target_profile("a100-qwen2.5-1.5b")))
    try:
        entry = recording.entries[0]
        made, accepted, said = stream_with_trees(replay, entry.prompt, entry.path[:TOKENS], SamplingParams(), None)
    finally:
        replay.close()
    assert said and made == entry.path[:TOKENS]
    assert accepted >= TOKENS // 4, accepted  # a pass of a few ms: some trees come after their positions


def test_the_replay_reads_a_prompt_in_pieces(tiny, tiny_recording):
    """A shared pass of many sessions gives a long prompt a piece at a time: the replay waits for the
    whole prompt before it looks the entry up (it failed every pass holding such a piece: the 7B
    profile at 64 users), and a history that starts no prompt is still refused."""
    from benchmarks.emulation.target import ReplayError, ReplayTarget
    from remote_verify.backends.target import Pass

    recording = Recording.load(tiny_recording)
    replay = ReplayTarget(recording, tiny.draft)
    entry = max(recording.entries, key=lambda e: len(e.prompt))
    cache, half = replay.new_cache(), len(entry.prompt) // 2
    replay.forward_many([Pass(cache, entry.prompt[:half], 1, argmax_only=True)])
    last = replay.forward_many([Pass(cache, entry.prompt[half:], 1, argmax_only=True)])[0]
    assert list(last) == entry.path[:1]
    stranger = [t for t in range(replay.vocab_size) if all(e.prompt[0] != t for e in recording.entries)][:3]
    with pytest.raises(ReplayError):
        replay.forward_many([Pass(replay.new_cache(), stranger, 1, argmax_only=True)])


def test_two_modes_compare_on_the_replies_both_finished():
    """`same_replies`: a mode's speed over another's on the (user, reply) pairs both finished, the
    same prompts, whatever else each window held (a window that reached one prompt further, a slow
    one, would otherwise count against the faster mode)."""
    from benchmarks.capacity import WaveRecord, same_replies

    def wave(mode, replies):
        return WaveRecord(users=1, mode=mode, rtt_ms=14, emulated="x", aggregate_tok_s=0, user_p50_tok_s=0,
                          user_p99_tok_s=0, user_min_tok_s=0, first_token_p50_s=0, first_token_p99_s=0,
                          users_at_20_tok_s=0, passes_per_token=0, acceptance=0, utilization=0, differing=0,
                          errors=[], time_scale=1, replies=replies)

    chain = wave("chain", [(0, 0, 1.0, 96), (0, 1, 2.0, 96), (0, 2, 3.0, 96)])
    tree = wave("trees8", [(0, 0, 0.5, 96), (0, 1, 1.5, 96), (0, 2, 1.0, 96), (0, 3, 9.0, 96)])
    assert same_replies(tree, chain) == (pytest.approx(6.0 / 3.0), 3)  # reply 3 is the tree's alone
    assert same_replies(chain, tree) == (pytest.approx(3.0 / 6.0), 3)
    assert same_replies(tree, wave("server", [])) is None


def test_first_tokens_compare_on_the_replies_both_began():
    """`same_first_tokens`: the first token's p99 in two modes over the (user, reply) pairs both began in
    the window: a long prompt only the faster mode reached is left out of both."""
    from benchmarks.capacity import WaveRecord, same_first_tokens, same_first_tokens_interval

    def wave(mode, firsts):
        return WaveRecord(users=2, mode=mode, rtt_ms=14, emulated="x", aggregate_tok_s=0, user_p50_tok_s=0,
                          user_p99_tok_s=0, user_min_tok_s=0, first_token_p50_s=0, first_token_p99_s=0,
                          users_at_20_tok_s=0, passes_per_token=0, acceptance=0, utilization=0, differing=0,
                          errors=[], time_scale=1, first_token_by_reply=firsts)

    server = wave("server", [(0, 1, 0.05), (1, 1, 0.06)])
    default = wave("default", [(0, 1, 0.04), (1, 1, 0.05), (1, 2, 0.4)])  # (1, 2): a long prompt, its own
    p99_default, p99_server, n = same_first_tokens(default, server)
    assert n == 2 and p99_default == pytest.approx(0.05, abs=1e-3) and p99_server == pytest.approx(0.06, abs=1e-3)
    assert same_first_tokens(default, wave("server", [])) is None
    low, high = same_first_tokens_interval(default, server)  # the two common replies resampled, (1, 2) left out
    assert 0.04 / 0.05 - 1e-6 <= low < high <= 0.05 / 0.06 + 1e-6  # (1, 2) in it would read 0.4 / 0.06
    assert same_first_tokens_interval(default, wave("server", [])) is None


def test_the_slowest_user_compares_on_the_replies_both_modes_finished():
    """`same_slowest`: each user's speed over the (user, reply) pairs both modes finished, the slowest of
    them in each mode. A reply only one mode reached (a slow prompt the faster mode got to) and the first
    wave (every user's first prompt at once) are left out of both."""
    from benchmarks.capacity import WaveRecord, same_slowest

    def wave(mode, replies):
        return WaveRecord(users=2, mode=mode, rtt_ms=14, emulated="x", aggregate_tok_s=0, user_p50_tok_s=0,
                          user_p99_tok_s=0, user_min_tok_s=0, first_token_p50_s=0, first_token_p99_s=0,
                          users_at_20_tok_s=0, passes_per_token=0, acceptance=0, utilization=0, differing=0,
                          errors=[], time_scale=10, replies=replies)

    server = wave("server", [(0, 0, 1.0, 96), (0, 1, 3.0, 96), (1, 0, 1.0, 96), (1, 1, 4.0, 96)])
    # user 1's reply 2 is slow and the default mode's alone; reply 0 of each is the first wave
    default = wave("default", [(0, 0, 9.0, 96), (0, 1, 2.0, 96), (1, 0, 9.0, 96), (1, 1, 3.0, 96),
                               (1, 2, 48.0, 96)])
    slow_default, slow_server, users, replies = same_slowest(default, server)
    assert (users, replies) == (2, 2)
    assert slow_default == pytest.approx(96 / 3.0 * 10) and slow_server == pytest.approx(96 / 4.0 * 10)
    assert same_slowest(default, wave("server", [(0, 0, 1.0, 96)])) is None  # the first wave alone


def test_whole_replies_compare_on_the_replies_both_modes_finished_under_the_full_load():
    """`same_reply_times`: a reply's whole time in two modes over the (user, reply) pairs both finished, less
    the first wave and each user's last reply in either mode (it ends while the others have stopped asking:
    a thinning service, which made a faster mode read slower on it than it was)."""
    from benchmarks.capacity import WaveRecord, same_reply_times

    def wave(mode, replies):
        return WaveRecord(users=2, mode=mode, rtt_ms=14, emulated="x", aggregate_tok_s=0, user_p50_tok_s=0,
                          user_p99_tok_s=0, user_min_tok_s=0, first_token_p50_s=0, first_token_p99_s=0,
                          users_at_20_tok_s=0, passes_per_token=0, acceptance=0, utilization=0, differing=0,
                          errors=[], time_scale=10, replies=replies)

    # server-only's last replies (0, 3) and (1, 2) ran in a thinning service: fast
    server = wave("server", [(0, 0, 9.0, 96), (0, 1, 20.0, 96), (0, 2, 20.0, 96), (0, 3, 5.0, 96),
                             (1, 0, 9.0, 96), (1, 1, 20.0, 96), (1, 2, 5.0, 96)])
    default = wave("default", [(0, 0, 9.0, 96), (0, 1, 10.0, 96), (0, 2, 22.0, 96), (0, 3, 10.0, 96),
                               (0, 4, 10.0, 96), (1, 0, 9.0, 96), (1, 1, 10.0, 96), (1, 2, 10.0, 96),
                               (1, 3, 10.0, 96)])
    whole = same_reply_times(default, server)
    assert whole.replies == 3  # (0, 1), (0, 2), (1, 1)
    assert whole.p99_s == pytest.approx(2.2) and whole.other_p99_s == pytest.approx(2.0)
    assert whole.slower == pytest.approx(1 / 3) and whole.worst == pytest.approx(1.1)
    low, high = whole.interval
    assert 0.5 - 1e-6 <= low <= high <= 1.1 + 1e-6
    assert same_reply_times(default, wave("server", [(0, 0, 9.0, 96), (0, 1, 20.0, 96)])) is None  # first, last


def test_a_recorded_guess_stays_first_where_a_new_evaluation_breaks_a_near_tie_the_other_way():
    from benchmarks.emulation.record import guess_first

    assert guess_first([[5, 0.36], [7, 0.35], [9, 0.1]], 7) == [[7, 0.35], [5, 0.36], [9, 0.1]]
    assert guess_first([[5, 0.5], [7, 0.3]], 5) == [[5, 0.5], [7, 0.3]]
    assert guess_first([[5, 0.5], [7, 0.3]], 8) == [[8, 0.5], [5, 0.5]]  # not among them: first all the same
