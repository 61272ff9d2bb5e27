"""Load: 32 concurrent sessions of at least 50 rounds each on one service (tiny models)."""

from __future__ import annotations

from benchmarks.load import run_load
from tests.local_draft.test_fallback import target_alone

MEMORY_SLACK_MIB = 16  # after minus before; the sessions' caches alone are several times this


def test_32_sessions_of_50_rounds_match_the_target_alone_and_give_back_their_memory(tiny, llamacpp_target):
    """No errors; every reply equals the target alone; the service's memory rises with the
    sessions' KV caches and returns to its baseline once they close. (Latency percentiles are
    printed by `python -m benchmarks.load`, not asserted: the machine is shared.)"""
    report = run_load(tiny.target_gguf, tiny.draft, backend="llamacpp", sessions=32, rounds=50, k=4, max_tokens=48,
                      pin_service=True)  # one CPU for the service, the other for the 32 drafters

    assert report.errors == [] and report.mismatches == []
    assert report.sessions == 32 and report.min_rounds >= 50 and report.rounds >= 32 * 50
    for prompt, reference in zip(report.prompts, report.references):  # the references are the target's own
        assert reference and reference == target_alone(llamacpp_target, prompt, len(reference))
    assert report.sessions_open_after == 0
    assert report.micro_batches >= report.target_passes > 0  # /metrics counts llama.cpp's graph runs
    assert report.rss_peak_mib - report.rss_before_mib > 2 * MEMORY_SLACK_MIB  # the caches were measurable
    assert report.rss_after_mib - report.rss_before_mib < MEMORY_SLACK_MIB
