"""The GPU benchmark's CPU mode (`python -m benchmarks.gpu --device cpu --tiny`) runs and reports every row."""

from __future__ import annotations

import json

import llama_cpp
import pytest

from benchmarks.gpu import main


def test_the_tiny_cpu_mode_measures_every_block_and_session_count(tiny, tmp_path, capsys):
    """Every block and session count gets positive timings, the floor comes from the measured copy
    bandwidth, the fast path picks eager's argmax, the tiny drafter is timed on the CPU (and on the GPU
    where llama.cpp offloads), and the table and gpu.json say the same. (The timings
    themselves are not asserted: the machine is shared.)"""
    report = main(["--device", "cpu", "--tiny", "--repeats", "2", "--draft", str(tiny.draft), "--out", str(tmp_path)])

    assert json.loads((tmp_path / "gpu.json").read_text()) == report
    (model,) = report["models"]
    assert model["model"] == "tiny" and model["dtype"] == "float32"
    assert [row["block"] for row in model["blocks"]] == [1, 2, 3, 5, 9, 17]
    assert [row["sessions"] for row in model["batched"]] == [1, 2, 4, 8, 16, 32]
    assert all(row["eager_ms"] > 0 and row["fast_ms"] > 0 for row in model["blocks"])
    assert all(row["fast_round_ms"] > 0 and row["eager_round_ms"] > 0 for row in model["batched"])
    assert model["floor_ms"] == pytest.approx(1000 * model["weight_bytes"] / (model["copy_bandwidth_gb_s"] * 1e9))
    assert model["argmax_agreement"] > 0.95  # random weights: near-flat logits, float32 on both paths
    assert "graph_vs_eager_static_max_diff" not in model  # no CUDA graphs on the CPU
    drafter = report["drafter"]
    assert drafter["cpu_ms_per_token"] > 0
    offload = llama_cpp.llama_supports_gpu_offload()
    assert drafter["gpu_offload"] == offload and (drafter["gpu_ms_per_token"] is None) == (not offload)
    table = capsys.readouterr().out
    assert ("n/a (no GPU offload)" in table) == (not offload)
    assert table.count("\n") > 6 + 6 and "floor" in table and str(tmp_path / "gpu.json") in table
    # the measurements as emulator profiles, in the shipped profiles' format
    from benchmarks.emulation.profiles import DrafterProfile, TargetProfile, load_profile

    fast = load_profile(tmp_path / "profile-tiny-fast.toml")
    assert isinstance(fast, TargetProfile) and fast.measured
    assert fast.pass_ms(1) == pytest.approx(model["blocks"][0]["fast_ms"], rel=1e-3)
    assert fast.pass_ms(5 * 32) == pytest.approx(model["batched"][-1]["fast_round_ms"], rel=1e-3)
    cpu = load_profile(tmp_path / "profile-drafter-cpu.toml")
    assert isinstance(cpu, DrafterProfile) and cpu.token_ms == pytest.approx(drafter["cpu_ms_per_token"], rel=1e-3)


def test_no_queued_times_the_batched_rounds_alone_and_the_profiles_keep_only_what_was_timed(tmp_path, capsys):
    """`--no-queued` (the decode curve at many sessions of a large model): every batched round is
    timed, no queued one, the table shows a dash, and the eager profile holds the single passes only."""
    report = main(["--device", "cpu", "--tiny", "--repeats", "2", "--blocks", "1", "--sessions", "1", "4", "8",
                   "--block", "1", "--no-queued", "--out", str(tmp_path)])

    (model,) = report["models"]
    assert [row["sessions"] for row in model["batched"]] == [1, 4, 8]
    assert all(row["fast_round_ms"] > 0 for row in model["batched"])
    assert all(row["eager_round_ms"] is None and row["eager_tokens_s"] is None for row in model["batched"])
    assert model["batched"][-1]["fast_vs_one_session"] > 0
    assert " - " in capsys.readouterr().out
    from benchmarks.emulation.profiles import load_profile

    fast = load_profile(tmp_path / "profile-tiny-fast.toml")
    assert fast.pass_ms(8) == pytest.approx(model["batched"][-1]["fast_round_ms"], rel=1e-3)
    eager = load_profile(tmp_path / "profile-tiny-eager.toml")
    assert eager.pass_ms(1) == pytest.approx(model["blocks"][0]["eager_ms"], rel=1e-3)
    assert "[8," not in (tmp_path / "profile-tiny-eager.toml").read_text()  # nothing untimed written
