"""Where first tokens waited, read from a pass trace (benchmarks/pass_trace_report.py)."""

import json

import pytest

from benchmarks.pass_trace_report import first_tokens, mark_window, read, read_windows, summary
from benchmarks.service_level import percentile


def _trace(tmp_path, passes):
    path = tmp_path / "passes.jsonl"
    lines = [{"opened": 0.0}] + [{"pass": began, "s": seconds, "members": 4, "tokens": tokens, "own": own,
                                  "budget": 8, "plain_s": seconds / 2, "first": first}
                                 for began, seconds, tokens, own, first in passes]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_a_first_token_is_split_into_the_running_pass_the_passes_waited_out_and_its_own(tmp_path):
    """A request at 1.8 s, during a pass of 1 to 2 s, waits out the pass of 2 to 3.5 s and is made by the one of
    3.5 to 4: 0.2 s of the running pass, 1.5 s in one pass waited out, 0.5 s its own. One at 4.2 s, made by the
    next pass at 4.5 to 5, waited out none. Emulated at a time scale of 10, every time a tenth. Each pass costs twice
    its plain one: half of each is guesses, and without them the running pass would have ended at 1.5 s, before the
    request came: it waited 0.2 s of that pass's guesses, not their 0.5 s nor their share of its 0.2 s."""
    path = _trace(tmp_path, [(1.0, 1.0, 6, 4, []), (2.0, 1.5, 12, 12, []), (3.5, 0.5, 6, 6, [["u", 30, 1.8]]),
                             (4.5, 0.5, 6, 4, [["v", 3, 4.2]])])
    made = first_tokens(read(path))
    assert [(m.seconds, m.running_s, m.waited_passes, m.waited_s, m.own_s, m.prompt) for m in made] == [
        pytest.approx((2.2, 0.2, 1, 1.5, 0.5, 30)), pytest.approx((0.8, 0.0, 0, 0.0, 0.5, 3))]
    assert made[0].own_over_plain == pytest.approx(2.0)
    assert [m.guesses_s for m in made] == [pytest.approx(0.2 + 0.75 + 0.25), pytest.approx(0.25)]
    said = summary(read(path), time_scale=10)
    assert said["passes"] == 4 and said["passes_beyond_budget"] == 1  # 12 tokens of its members' own, 8 the budget
    assert said["first_tokens"] == 2 and said["first_tokens_that_waited_a_pass"] == 1
    assert said["first_token_p99_ms"] == pytest.approx(220.0) and said["tail"]["waited_passes"] == 1
    # less the guesses each waited on: 2.2 - 1.2 and 0.8 - 0.25 s, a tenth of each
    assert said["first_token_p99_less_guesses_ms"] == pytest.approx(100.0)
    assert said["first_token_p50_less_guesses_ms"] == pytest.approx(percentile([100.0, 55.0], 50))
    assert said["median"]["ms"] == pytest.approx(220.0) and said["median"]["own_ms"] == pytest.approx(50.0)
    assert said["median"]["guesses_ms"] == pytest.approx(120.0)
    assert said["median"]["between_ms"] == pytest.approx(0.0, abs=1e-9)  # its passes end to end
    # from one pass's end to the next one's start: 0, 0 and 0.5 s, in this machine's ms (not a tenth)
    assert said["between_passes_p50_ms"] == pytest.approx(0.0, abs=1e-9)
    assert said["between_passes_p90_ms"] == pytest.approx(500.0)


def test_the_benchmarks_windows_mark_what_is_read(tmp_path):
    """With windows marked (`benchmarks.load --trace-passes`), only the passes begun in one and the first
    tokens asked in one count: a warm-up's first token (asked at 0.5 s) is left out, one asked at 1.5 s is read
    with the pass running since 1 s though that pass began before the window (1.2 to 5 s, 3.8 device seconds at a
    time scale of 1): 3 passes, 1 first token, 0.33 a pass."""
    path = _trace(tmp_path, [(0.0, 1.0, 6, 6, []), (1.0, 1.0, 6, 4, [["w", 9, 0.5]]), (2.0, 1.5, 12, 12, []),
                             (3.5, 0.5, 6, 6, [["u", 30, 1.5]]), (4.5, 0.5, 6, 4, [])])
    mark_window(path, 1.2, 5.0, mode="default", users=2)
    mark_window(path, 6.0, 7.0, mode="server", users=2)
    mark_window(path, 8.0, 9.0, mode="default", users=2, rtt_ms=100.0)
    assert read_windows(path, "default") == [(1.2, 5.0), (8.0, 9.0)] and len(read(path)) == 5  # a mark is no pass
    assert read_windows(path, "default", 100.0) == [(8.0, 9.0)] and read_windows(path, rtt_ms=14.0) == []
    assert read_windows(path) == [(1.2, 5.0), (6.0, 7.0), (8.0, 9.0)]
    assert summary(read(path), 1.0, read_windows(path)[:2])["passes_a_second"] == pytest.approx(3 / 4.8)
    said = summary(read(path), 1.0, read_windows(path, "default")[:1])
    assert said["windows"] == 1 and said["passes"] == 3 and said["first_tokens"] == 1
    assert said["median"]["running_ms"] == pytest.approx(500.0) and said["median"]["ms"] == pytest.approx(2500.0)
    assert said["first_tokens_a_pass"] == pytest.approx(1 / 3)
    assert said["passes_a_second"] == pytest.approx(3 / 3.8)
    everything = summary(read(path), 1.0)
    assert everything["windows"] == 0 and everything["passes"] == 5 and everything["first_tokens"] == 2
