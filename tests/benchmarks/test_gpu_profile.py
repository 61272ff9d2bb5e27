"""The measured profiles are what `python -m benchmarks.gpu_profile` fits to the shipped H200 reports."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from benchmarks.gpu_profile import main

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "benchmarks" / "emulation" / "profiles"


@pytest.mark.parametrize("name", ["h200-qwen2.5-7b-torch", "h200-qwen2.5-32b-torch"])
def test_a_shipped_measured_profile_is_the_fit_of_its_reports(name, tmp_path, monkeypatch):
    """The command written at the top of the profile, run on the reports in benchmarks/results/gpu-h200/,
    writes the profile byte for byte."""
    shipped = (PROFILES / f"{name}.toml").read_text()
    command = shlex.split(shipped.splitlines()[0].removeprefix("# MEASURED: written by `").removesuffix("`"))
    assert command[:3] == ["python", "-m", "benchmarks.gpu_profile"]
    monkeypatch.chdir(REPO)
    main(command[3:] + ["--out", str(tmp_path / "fitted.toml")])
    assert (tmp_path / "fitted.toml").read_text() == shipped


def test_reports_at_one_context_are_refused_with_what_to_run(capsys):
    """One context gives no context term: the fit says which runs it needs."""
    with pytest.raises(SystemExit):
        main([str(REPO / "benchmarks/results/gpu-h200/decode"), "--model", "7b", "--name", "x"])
    assert "at two contexts or more" in capsys.readouterr().err


def test_a_pass_curve_never_falls_and_the_terms_read_the_runs_slopes():
    """Fitted from the shipped runs: more tokens never cost less, and the two context terms are the
    lone session's and 32 members' slopes (7B: about 1.1 and 0.06 ms a 1,000 cached tokens)."""
    from benchmarks.gpu_profile import fit, observations, read_reports

    runs = [REPO / "benchmarks/results/gpu-h200" / name for name in ("default", "decode", "ctx2048", "ctx4096")]
    result = fit(observations(read_reports(runs), "7b"))
    costs = [ms for _, ms in result.points]
    assert costs == sorted(costs) and result.points[-1][0] == 160
    assert result.each_members == 32 and result.contexts == [512, 2048, 4096]
    assert 1.0 < result.longest_ms_per_ktoken < 1.2 and 0.05 < result.each_ms_per_ktoken < 0.07
