"""Runs of one cell read side by side (benchmarks/compare_runs.py): a default-mode run against a server-only
run kept apart, as `benchmarks.load` prints two modes run together."""

from __future__ import annotations

import json
from dataclasses import asdict

from benchmarks.capacity import WaveRecord
from benchmarks.compare_runs import main


def record(mode: str, aggregate: float, wall_s: float) -> WaveRecord:
    """Four users' replies 1 and 2, each of 96 tokens in `wall_s`, and their first tokens."""
    return WaveRecord(users=4, mode=mode, rtt_ms=14.0, emulated="a100-qwen2.5-32b", aggregate_tok_s=aggregate,
                      user_p50_tok_s=aggregate / 4, user_p99_tok_s=aggregate / 4, user_min_tok_s=aggregate / 4,
                      first_token_p50_s=0.1, first_token_p99_s=0.2, users_at_20_tok_s=0, passes_per_token=1.0,
                      acceptance=0.0, utilization=0.9, differing=0, errors=[], time_scale=1.0,
                      replies=[(user, k, wall_s, 96) for user in range(4) for k in (1, 2)],
                      first_token_by_reply=[(user, k, 0.1) for user in range(4) for k in (1, 2)])


def test_a_default_run_is_read_against_a_server_only_run_kept_apart(tmp_path, capsys):
    server, default = tmp_path / "server.json", tmp_path / "default.json"
    server.write_text(json.dumps([asdict(record("server", 100.0, 4.0))]))
    default.write_text(json.dumps([asdict(record("default", 150.0, 2.0))]))
    assert main([str(server), str(default)]) == 0
    said = capsys.readouterr().out
    assert f"== {default}" in said
    assert "default / server: aggregate x1.50" in said
    assert "on the same 8 replies x2.00" in said  # the same replies, half the time
    assert "the slowest user on the same 8 replies of 4 users 48.0 tok/s against 24.0 (x2.00)" in said


def test_a_first_file_without_server_only_is_refused_with_what_to_give(tmp_path, capsys):
    default = tmp_path / "default.json"
    default.write_text(json.dumps([asdict(record("default", 150.0, 2.0))]))
    assert main([str(default), str(default)]) == 2
    assert "holds no server-only record: give the run made with --modes server" in capsys.readouterr().err
