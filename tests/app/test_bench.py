"""`specwire bench` end to end on the tiny models: the table, the JSON and the plot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SPECWIRE = str(Path(sys.executable).parent / "specwire")
MODES = ["server", "k0", "k4", "auto+ahead", "offline", "hf-assisted"]


def test_bench_compares_every_mode_at_every_round_trip(tiny, tmp_path):
    """Two round trips, six modes, one prompt per kind: every cell measured, greedy modes agree."""
    out = tmp_path / "bench"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # the reference's conversions land here
    done = subprocess.run(
        [SPECWIRE, "bench", "--draft", str(tiny.draft), "--target", str(tiny.target), "--rtt-ms", "0,30",
         "--modes", ",".join(MODES), "--prompts-per-kind", "1", "--max-tokens", "12", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for mode in MODES:
        assert f"\n{mode} " in done.stdout, mode
    assert "tokens/s, code" in done.stdout and "adaptive k against the best fixed k" in done.stdout
    assert "runs" in done.stderr  # the progress bar

    report = json.loads((out / "bench.json").read_text())
    runs = report["runs"]
    # 4 kinds x (4 networked modes x 2 round trips, offline once), and the reference once a kind
    assert len(runs) == 4 * (4 * 2 + 1) + 4
    cells = {(c["mode"], c["rtt_ms"], c["prompt_kind"]): c for c in report["summary"]}
    for rtt in (0.0, 30.0):
        server, alone, hybrid = (cells[mode, rtt, "all"] for mode in ("server", "k0", "k4"))
        assert server["passes_per_token"] == 1.0 and alone["passes_per_token"] == 1.0
        assert hybrid["passes_per_token"] < 1.0 and hybrid["acceptance_by_position"]
        assert alone["round_trips_per_token"] >= 1.0 > server["round_trips_per_token"]
        for mode in ("k0", "k4", "auto+ahead"):  # greedy: the target's tokens, whatever the mode
            assert cells[mode, rtt, "all"]["same_tokens_as_target"] == 4, mode
    assert cells["offline", 0.0, "all"]["passes_per_token"] == 0.0
    assert cells["hf-assisted", 0.0, "all"]["passes_per_token"] > 0.0
    slow = [r for r in runs if r["mode"] == "k0" and r["rtt_ms"] == 30.0]
    assert all(r["wall_s"] >= r["round_trips"] * 0.030 for r in slow)  # the emulated round trips were paid
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ngram_and_mixed_modes_report_acceptance_by_drafter(tiny, tmp_path):
    """Modes ngram and mixed on the repeating kind: the target's tokens, acceptance by drafter, the ratios.

    At a 50 ms round trip, as a service on another machine: there a model draft pays on any
    machine. At 0 ms the tiny target (about 1 ms a pass) is faster than any draft, the
    controller rightly drafts nothing, and which drafter shows up depends on the machine."""
    out = tmp_path / "bench"
    done = subprocess.run(
        [SPECWIRE, "bench", "--draft", str(tiny.draft), "--target", str(tiny.target_gguf), "--backend", "llamacpp",
         "--rtt-ms", "50", "--modes", "server,k0,auto+ahead,ngram,mixed", "--kinds", "repeat",
         "--prompts-per-kind", "2", "--max-tokens", "24", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mixed vs auto+ahead" in done.stdout and "ngram vs k0" in done.stdout
    cells = {(c["mode"], c["prompt_kind"]): c for c in json.loads((out / "bench.json").read_text())["summary"]}
    for mode in ("ngram", "mixed"):
        assert cells[mode, "repeat"]["same_tokens_as_target"] == 2, mode
    assert set(cells["ngram", "repeat"]["by_source"]) <= {"ngram"}
    assert "model" in cells["mixed", "repeat"]["by_source"]


def test_bench_refuses_bad_choices_clearly(tiny):
    """An unknown mode or a malformed round-trip list: exit 2 and a message naming the choices."""
    for flags, words in ((["--modes", "k4,turbo"], "unknown mode(s) turbo"),
                         (["--rtt-ms", "0,fast"], "--rtt-ms takes comma-separated milliseconds")):
        done = subprocess.run([SPECWIRE, "bench", "--draft", str(tiny.draft), "--target", str(tiny.target), *flags],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and words in done.stderr, done.stderr


def test_colocated_shows_the_shared_layout_beside_the_pinned_one(tiny, tmp_path):
    """--colocated: each mode runs with every core shared and pinned, both in the one table, both exact
    (checked against k0: no server-only mode ran)."""
    out = tmp_path / "bench"
    done = subprocess.run(
        [SPECWIRE, "bench", "--draft", str(tiny.draft), "--target", str(tiny.target_gguf), "--backend", "llamacpp",
         "--rtt-ms", "0", "--modes", "k0,auto+ahead", "--kinds", "code", "--prompts-per-kind", "1",
         "--max-tokens", "12", "--colocated", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for mode in ("k0", "auto+ahead"):
        for layout in ("shared", "pinned"):
            assert f"\n{mode}/{layout} " in done.stdout, (mode, layout)
    assert "in the same cell, shared:" in done.stdout and "in the same cell, pinned:" in done.stdout
    report = json.loads((out / "bench.json").read_text())
    assert report["config"]["colocated"] is True
    cells = {(c["mode"], c["prompt_kind"]): c for c in report["summary"]}
    for layout in ("shared", "pinned"):  # without server-only, k0 is the target alone to compare with
        assert cells[f"auto+ahead/{layout}", "all"]["same_tokens_as_target"] == 1
        assert cells[f"k0/{layout}", "all"]["same_tokens_as_target"] is None


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def test_a_terminated_bench_leaves_no_service_running(tiny, tmp_path):
    """SIGTERM to `specwire bench` while it measures: the `specwire serve` it started stops too
    (it used to be re-parented to init and run on)."""
    services: list[int] = []
    bench = subprocess.Popen(
        [SPECWIRE, "bench", "--draft", str(tiny.draft), "--target", str(tiny.target_gguf), "--backend", "llamacpp",
         "--rtt-ms", "0", "--modes", "k0", "--prompts-per-kind", "1", "--max-tokens", "4000",
         "--out", str(tmp_path / "bench")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not services and time.monotonic() < deadline:
            services = [pid for pid in _children(bench.pid)
                        if b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
            time.sleep(0.1)
        assert services, "the bench started no service"
        time.sleep(2)  # the service is listening and the bench is measuring
        bench.terminate()
        bench.wait(30)
        deadline = time.monotonic() + 30
        while _alive(services[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(services[0]), "the service outlived the bench"
    finally:
        bench.kill()
        for pid in services:  # a failed run must not leave the service behind either
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
