"""`specwire models export-onnx` and `specwire serve --backend onnx` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.onnx_manifest import OnnxManifest
from models.vocab import gguf_token_texts
from wire.protocol import vocab_fingerprint

SPECWIRE = str(Path(sys.executable).parent / "specwire")


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """The tiny GGUF target exported through the command line (de-quantized into a private cache)."""
    home = tmp_path_factory.mktemp("cli-onnx")
    out = home / "target-onnx"
    env = {**os.environ, "XDG_CACHE_HOME": str(home / "cache")}
    done = subprocess.run([SPECWIRE, "models", "export-onnx", str(tiny.target_gguf), str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return out, done


def test_export_onnx_shows_its_stages_and_prints_the_folder(exported, tiny):
    """Five numbered stages on stderr, the folder on stdout, the GGUF's vocabulary in the manifest."""
    out, done = exported
    for stage in range(1, 6):
        assert f"[{stage}/5]" in done.stderr, done.stderr
    assert done.stdout.strip() == str(out)
    assert OnnxManifest.read(out).vocab_fingerprint == vocab_fingerprint(gguf_token_texts(tiny.target_gguf))


def test_export_onnx_of_a_missing_target_is_a_clear_error(tmp_path):
    """One line naming the path, exit status 2, no traceback."""
    done = subprocess.run([SPECWIRE, "models", "export-onnx", str(tmp_path / "none.gguf"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no target at" in done.stderr and "Traceback" not in done.stderr


def test_serve_backend_onnx_gives_the_same_tokens_with_and_without_drafting(exported, tiny):
    """serve --backend onnx; generate --k 0 and --k 4 agree token for token, and drafts are accepted.

    In rounds, where every block of 4 is verified: in the default mode the tiny target (about a
    millisecond a pass) outruns the drafter's guesses by a machine-dependent share (0.2 of them
    kept in one full run, most of them alone), which says nothing of the backend."""
    out, _ = exported
    process = subprocess.Popen([SPECWIRE, "-v", "serve", "--backend", "onnx", "--target", str(out), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("listening on ws://127.0.0.1:"), line + process.stderr.read()
        url = line.split()[-1]
        results = {}
        for k in ("0", "4"):
            done = subprocess.run([SPECWIRE, "generate", "--draft", str(tiny.draft), "--server", url, "--prompt",
                                   "def quicksort(arr):", "--max-tokens", "48", "--temperature", "0", "--json",
                                   "--mode", "rounds", "--k", k], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            results[k] = json.loads(done.stdout)
        assert results["4"]["token_ids"] == results["0"]["token_ids"] and len(results["0"]["token_ids"]) == 48
        assert results["4"]["stats"]["acceptance_rate"] > 0.5
    finally:
        process.terminate()
        stderr = process.communicate(timeout=20)[1]
    assert "CPUExecutionProvider" in stderr  # the provider in use is logged
