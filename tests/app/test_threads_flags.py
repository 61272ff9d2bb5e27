"""Thread flags: --threads and --draft-threads parse, refuse bad values, and reach the models and the service."""

from __future__ import annotations

import pytest

from app.chat.embedded_service import EmbeddedService
from app.cli import build_parser
from app.threads_flags import colocated_serve_flags
from wire.threads import DRAFT_THREADS, physical_cores

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


def test_serve_batch_threads(monkeypatch, capsys):
    """serve --batch-threads: default None (as many as --threads), a value, the environment, a refusal."""
    monkeypatch.delenv("SPECWIRE_BATCH_THREADS", raising=False)
    assert build_parser().parse_args(["serve"]).batch_threads is None
    assert build_parser().parse_args(["serve", "--batch-threads", "3"]).batch_threads == 3
    monkeypatch.setenv("SPECWIRE_BATCH_THREADS", "4")
    assert build_parser().parse_args(["serve", "--threads", "1"]).batch_threads == 4
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--batch-threads", "none"])
    assert "--batch-threads: a thread count is a whole number" in capsys.readouterr().err


def test_embedded_service_gets_the_colocated_share():
    """The chat's service decodes with the physical cores less the drafter's threads (at least 1) and
    runs blocks with every physical core."""
    service = EmbeddedService("t.gguf", "llamacpp", thread_flags=colocated_serve_flags(1))
    command = service.command()
    assert command[command.index("--threads") + 1] == str(max(1, physical_cores() - 1))
    assert command[command.index("--batch-threads") + 1] == str(physical_cores())
    assert "--threads" not in EmbeddedService("t.gguf", "llamacpp").command()
    parsed = build_parser().parse_args(["serve", *colocated_serve_flags(1)])  # serve takes them as they are
    assert (parsed.threads, parsed.batch_threads) == (max(1, physical_cores() - 1), physical_cores())


def test_models_take_the_planned_threads(tiny):
    """A drafter defaults to 1 thread and takes another count; the llama.cpp target takes --threads."""
    from local_draft.draft_model import DraftModel
    from remote_verify.backends.factory import load_backend

    assert DraftModel(tiny.draft, n_ctx=256).n_threads == 1
    assert DraftModel(tiny.draft, n_ctx=256, n_threads=2).n_threads == 2
    one = load_backend("llamacpp", tiny.target_gguf, device="cpu", threads=1)
    assert (one.n_threads, one.n_threads_batch) == (1, 1)  # blocks take --threads unless told otherwise
    split = load_backend("llamacpp", tiny.target_gguf, device="cpu", threads=1, batch_threads=2)
    assert (split.n_threads, split.n_threads_batch) == (1, 2)
    params = split.context_params(1)
    assert (params.n_threads, params.n_threads_batch) == (1, 2)
    assert load_backend("llamacpp", tiny.target_gguf, device="cpu").n_threads == physical_cores()


def write_config(tmp_path, monkeypatch, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("SPECWIRE_CONFIG", str(path))
    return path


@pytest.mark.parametrize("command", CLIENT_COMMANDS)
def test_config_file_threads_below_flag_and_environment(command, tmp_path, monkeypatch):
    """[threads] in the config file sets the counts; the environment beats it and the flag beats both."""
    monkeypatch.delenv("SPECWIRE_DRAFT_THREADS", raising=False)
    monkeypatch.delenv("SPECWIRE_THREADS", raising=False)
    monkeypatch.delenv("SPECWIRE_BATCH_THREADS", raising=False)
    write_config(tmp_path, monkeypatch, "[threads]\ndraft = 2\nservice = 3\nservice_batch = 8\n")
    parser = build_parser()
    assert parser.parse_args(command).draft_threads == 2
    assert parser.parse_args(["serve"]).threads == 3
    assert parser.parse_args(["serve"]).batch_threads == 8
    assert parser.parse_args(command + ["--draft-threads", "4"]).draft_threads == 4
    monkeypatch.setenv("SPECWIRE_DRAFT_THREADS", "5")
    monkeypatch.setenv("SPECWIRE_THREADS", "6")
    assert parser.parse_args(command).draft_threads == 5
    assert parser.parse_args(["serve"]).threads == 6
    assert parser.parse_args(["serve", "--threads", "7"]).threads == 7


@pytest.mark.parametrize("text, says", [
    ("[threads]\ndraft = 0\n", "[threads] draft: a thread count is at least 1"),
    ("[threads]\ndraft = \"two\"\n", "[threads] draft must be a whole number, got 'two'"),
    ("[threads]\ndrafter = 2\n", "[threads] has no setting drafter (there are draft, service, service_batch)"),
    ("[threads\n", "cannot read the config file"),
])
def test_a_wrong_config_file_count_names_the_file_and_key(text, says, tmp_path, monkeypatch, capsys):
    """A bad [threads] value is a usage error naming the file and the key, and only for the command that reads it."""
    monkeypatch.delenv("SPECWIRE_DRAFT_THREADS", raising=False)
    path = write_config(tmp_path, monkeypatch, text)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["generate", "--prompt", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and (str(path) in err)
    assert build_parser().parse_args(["models", "list"]).command == "models"  # other commands unaffected
