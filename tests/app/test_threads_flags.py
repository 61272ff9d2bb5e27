"""Thread flags: --threads and --draft-threads parse, refuse bad values, and reach the models and the service."""

from __future__ import annotations

import pytest

from app.chat.embedded_service import EmbeddedService
from app.cli import build_parser
from wire.threads import DRAFT_THREADS, physical_cores, shared_service_threads

CLIENT_COMMANDS = [["generate", "--prompt", "x"], ["chat"], ["demo"], ["bench"]]


@pytest.mark.parametrize("command", CLIENT_COMMANDS)
def test_draft_threads_default_and_value(command, monkeypatch):
    """Every client command takes --draft-threads; without it the drafter gets 1 thread."""
    monkeypatch.delenv("SPECWIRE_DRAFT_THREADS", raising=False)
    parser = build_parser()
    assert parser.parse_args(command).draft_threads == DRAFT_THREADS == 1
    assert parser.parse_args(command + ["--draft-threads", "3"]).draft_threads == 3


@pytest.mark.parametrize("command", CLIENT_COMMANDS)
@pytest.mark.parametrize("value", ["0", "many"])
def test_bad_draft_threads_are_refused(command, value, capsys):
    """A thread count below 1 or not a number is a usage error naming the flag."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(command + ["--draft-threads", value])
    assert exit_info.value.code == 2
    assert "--draft-threads: a thread count" in capsys.readouterr().err


def test_serve_threads(monkeypatch, capsys):
    """serve --threads: default None (physical cores, chosen by the backend), a value, the environment, a refusal."""
    monkeypatch.delenv("SPECWIRE_THREADS", raising=False)
    assert build_parser().parse_args(["serve"]).threads is None
    assert build_parser().parse_args(["serve", "--threads", "2"]).threads == 2
    monkeypatch.setenv("SPECWIRE_THREADS", "5")
    assert build_parser().parse_args(["serve"]).threads == 5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--threads", "-1"])
    assert "--threads: a thread count is at least 1" in capsys.readouterr().err


def test_embedded_service_gets_the_cores_the_drafter_leaves():
    """The chat's service is started with the physical cores less the drafter's threads (at least 1)."""
    service = EmbeddedService("t.gguf", "llamacpp", threads=shared_service_threads(1))
    command = service.command()
    assert command[command.index("--threads") + 1] == str(max(1, physical_cores() - 1))
    assert "--threads" not in EmbeddedService("t.gguf", "llamacpp").command()


def test_models_take_the_planned_threads(tiny):
    """A drafter defaults to 1 thread and takes another count; the llama.cpp target takes --threads."""
    from local_draft.draft_model import DraftModel
    from remote_verify.backends import load_backend

    assert DraftModel(tiny.draft, n_ctx=256).n_threads == 1
    assert DraftModel(tiny.draft, n_ctx=256, n_threads=2).n_threads == 2
    assert load_backend("llamacpp", tiny.target_gguf, device="cpu", threads=1).n_threads == 1
    assert load_backend("llamacpp", tiny.target_gguf, device="cpu").n_threads == physical_cores()
