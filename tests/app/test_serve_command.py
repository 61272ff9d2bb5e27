"""`specwire serve` flags: limits with their defaults in --help, and clear refusals of bad values."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from app.cli import build_parser, main
from tests.remote_verify.test_access import tls_files  # noqa: F401  (a fixture: a CA and a certificate it signed)
from wire.limits import BATCH_TOKENS, FIRST_TOKEN_ROOM, FIRST_TOKEN_ROOM_MS, ServiceLimits


def test_help_names_every_limit_with_its_default(capsys):
    """--help lists each limit flag and the default it takes."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    defaults = ServiceLimits()
    for flag, value in (("--max-frame-bytes", defaults.max_frame_bytes), ("--max-sessions", defaults.max_sessions),
                        ("--idle-timeout", defaults.idle_timeout_s), ("--rate", defaults.rate_per_s),
                        ("--rate-burst", defaults.rate_burst), ("--drain-timeout", defaults.drain_timeout_s),
                        ("--max-draft", 32), ("--max-context", 4096), ("--batch-tokens", BATCH_TOKENS),
                        ("--first-token-room", FIRST_TOKEN_ROOM), ("--first-token-room-ms", FIRST_TOKEN_ROOM_MS)):
        assert flag in text and f"(default: {value})" in text[text.index(flag):], flag
    for flag in ("--tls-cert", "--tls-key", "--insecure-no-auth", "--log-format"):
        assert flag in text


@pytest.mark.parametrize("args, words", [
    (["--max-sessions", "0"], "--max-sessions must be at least 1"),
    (["--rate", "0"], "--rate must be more than 0"),
    (["--batch-tokens", "-1"], "--batch-tokens must be 0 (one session a pass) or more"),
    (["--first-token-room", "-0.5"], "--first-token-room must be 0 or more"),
    (["--first-token-room", "nan"], "--first-token-room must be 0 or more"),
    (["--first-token-room-ms", "-20"], "--first-token-room-ms must be 0 or more"),
    (["--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
    (["--tls-cert", "missing.pem", "--tls-key", "missing.pem"], "cannot use the TLS certificate missing.pem"),
    (["--trace-passes", "/no-such-folder/passes.jsonl"], "cannot write the pass trace /no-such-folder/passes.jsonl"),
])
def test_bad_service_settings_are_refused_before_loading_anything(tiny, capsys, args, words):
    """Each bad setting stops `serve` with status 2 and a message naming it."""
    assert main(["serve", "--target", str(tiny.target_gguf), "--port", "0", *args]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("flags, budget", [([], BATCH_TOKENS), (["--no-batch"], 0), (["--batch-tokens", "64"], 64)])
def test_shared_passes_are_on_by_default_and_can_be_turned_off(flags, budget):
    """--batch-tokens sets the budget of a shared pass; --no-batch is --batch-tokens 0."""
    assert build_parser().parse_args(["serve", *flags]).batch_tokens == budget


@pytest.mark.parametrize("flags, room, beside_40_ms", [([], FIRST_TOKEN_ROOM, 0.25),
                                                       (["--first-token-room", "0"], 0.0, 0.0),
                                                       (["--first-token-room-ms", "20"], FIRST_TOKEN_ROOM, 0.5)])
def test_the_first_token_room_reaches_the_services_ledger(tiny, monkeypatch, flags, room, beside_40_ms):
    """--first-token-room is the room a starting member gives the pass, in the queue `specwire serve` builds, and
    --first-token-room-ms bounds it in time: beside a plain pass of 40 ms, the default's 10 ms is a room of 0.25,
    20 ms one of 0.5. (The service's run is replaced by one that reads its queue and returns: nothing is
    served.)"""
    from remote_verify.server import VerifyService

    rooms = []

    async def read_the_room(service, announce) -> None:
        ledger = service.queue.ledger
        rooms.append((ledger.room("a new reply", starting=True), ledger.room("a new reply", True, plain_s=0.040)))
        service.queue.shutdown()

    monkeypatch.setattr(VerifyService, "run", read_the_room)
    assert main(["serve", "--target", str(tiny.target_gguf), "--port", "0", *flags]) == 0
    assert rooms == [(room, pytest.approx(beside_40_ms))]


def test_the_pass_trace_reaches_the_services_queue(tiny, monkeypatch, tmp_path):
    """--trace-passes FILE: the queue `specwire serve` builds writes its passes there (opened with a first line);
    without it, nothing is written. (The service's run is replaced by one that reads its queue: nothing is served.)"""
    from remote_verify.server import VerifyService

    traces = []

    async def read_the_trace(service, announce) -> None:
        traces.append(service.queue.trace)
        service.queue.shutdown()

    monkeypatch.setattr(VerifyService, "run", read_the_trace)
    path = tmp_path / "passes.jsonl"
    assert main(["serve", "--target", str(tiny.target_gguf), "--port", "0", "--trace-passes", str(path)]) == 0
    assert main(["serve", "--target", str(tiny.target_gguf), "--port", "0"]) == 0
    assert traces[0].path == path and traces[1] is None
    assert '"opened"' in path.read_text()


@pytest.mark.parametrize("flags, kernels", [([], "batch-invariant"), (["--no-batch-invariant"], "batch-shaped kernels")])
def test_serve_verifies_with_batch_invariant_kernels_unless_told_not_to(tiny, flags, kernels):
    """On llama.cpp the default is exact at near-ties; --no-batch-invariant takes the fast kernels."""
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "-v", "serve", "--target", str(tiny.target_gguf),
                                "--port", "0", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()  # once the target is loaded
    process.terminate()
    log = process.communicate(timeout=30)[1]
    assert line.startswith("listening on"), log
    assert f"with llama.cpp (llamacpp:cpu, {kernels})" in log, log


def test_an_onnx_target_is_not_served_batch_invariant(tmp_path):
    """ONNX Runtime has no such mode: asking for it says so and names the backends that have it."""
    from models.onnx_manifest import MANIFEST_NAME
    from remote_verify.backends.factory import load_backend

    (tmp_path / MANIFEST_NAME).write_text("{}")
    with pytest.raises(ValueError, match="no batch-invariant mode.*llamacpp or torch"):
        load_backend("onnx", tmp_path, batch_invariant=True)


def test_serve_torch_static_gives_each_allowed_session_a_slot_of_the_context_limit(tiny):
    """--torch-static serves the static torch path: --max-sessions slots of --max-context positions."""
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "-v", "serve", "--target", str(tiny.target),
                                "--backend", "torch", "--device", "cpu", "--torch-static", "--max-sessions", "3",
                                "--max-context", "512", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()  # once the target is loaded
    process.terminate()
    log = process.communicate(timeout=30)[1]
    assert line.startswith("listening on"), log
    assert "static KV cache: 3 slots of 512 positions (torch.float32), CUDA graphs off" in log, log


def _serve_log(tiny, *flags: str, python_flags: tuple[str, ...] = ()) -> str:
    """What `serve` on the tiny GGUF target wrote to stderr by the time it listened. The log goes to
    a file: a pipe left unread while waiting for the port would fill and stop the service mid-start."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen([sys.executable, *python_flags, "-m", "app.cli", "serve", "--target",
                                    str(tiny.target_gguf), "--port", "0", *flags],
                                   stdout=subprocess.PIPE, stderr=log, text=True)
        line = process.stdout.readline()
        process.terminate()
        process.communicate(timeout=30)
        log.seek(0)
        text = log.read()
    assert line.startswith("listening on"), text
    return text


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_serving_a_gguf_target_on_a_host_without_a_gpu_does_not_load_torch(tiny, device):
    """`serve` on a GGUF target picks llama.cpp without importing torch (seconds of a start) to ask
    about CUDA: never with `--device cpu`, and with the default `auto` only where a GPU driver's
    device node says there may be one. The CLI's own imports, as `python -X importtime` lists them."""
    from remote_verify.backends.factory import GPU_DEVICE_NODES

    log = _serve_log(tiny, "--device", device, python_flags=("-X", "importtime"))
    imported = {line.rsplit("|", 1)[-1].strip() for line in log.splitlines() if line.startswith("import time:")}
    assert "llama_cpp" in imported, "the llama.cpp backend was not loaded"
    may_have_a_gpu = device == "auto" and any(os.path.exists(node) for node in GPU_DEVICE_NODES)
    assert ("torch" in imported) == may_have_a_gpu, sorted(name for name in imported if name.startswith("torch"))[:5]


def test_a_token_without_tls_on_a_public_address_is_warned_about(tiny, tmp_path, tls_files):
    """`serve --host 0.0.0.0 --token-file` without TLS says loudly that clients send the token in the
    clear; on loopback, or with TLS, it does not."""
    token = tmp_path / "token"
    token.write_text("s3cret")
    token.chmod(0o600)
    warning = "with a token but without TLS: every client sends the token in the clear"
    assert warning in _serve_log(tiny, "--host", "0.0.0.0", "--token-file", str(token))
    assert warning not in _serve_log(tiny, "--host", "127.0.0.1", "--token-file", str(token))
    assert warning not in _serve_log(tiny, "--host", "0.0.0.0", "--token-file", str(token),
                                     "--tls-cert", str(tls_files["cert"]), "--tls-key", str(tls_files["key"]))


def test_sessions_whose_kv_memory_cannot_fit_are_refused_at_start(tiny, capsys):
    """--max-sessions whose KV caches need more memory than the machine has: serve stops at start
    with a message naming --max-sessions and --max-context and how many would fit, instead of
    meeting the OOM killer once the sessions come."""
    assert main(["serve", "--target", str(tiny.target_gguf), "--port", "0", "--max-sessions", "10000000"]) == 2
    err = capsys.readouterr().err
    assert "refusing to start: --max-sessions 10000000 x --max-context 4096 need" in err, err
    assert "lower --max-sessions (at most" in err and "or --max-context" in err


@pytest.mark.parametrize(("flags", "environment", "expected"), [
    ((), {}, None), (("--torch-static",), {}, True), (("--no-torch-static",), {}, False),
    ((), {"SPECWIRE_TORCH_STATIC": "0"}, False), ((), {"SPECWIRE_TORCH_STATIC": "1"}, True),
    (("--no-torch-static",), {"SPECWIRE_TORCH_STATIC": "1"}, False)])
def test_torch_static_unasked_is_left_to_the_device(monkeypatch, flags, environment, expected):
    """Neither flag nor variable: None, which the backend factory reads as on a GPU and off on the CPU;
    either one decides, and the flag wins over the variable."""
    from app.cli import build_parser

    monkeypatch.delenv("SPECWIRE_TORCH_STATIC", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["serve", *flags])
    assert args.torch_static is expected
