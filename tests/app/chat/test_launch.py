"""`specwire chat` before the screen opens: flags checked, a missing draft names the fetch command, --list."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.chat.launch import settings_from
from app.chat.store import ChatStore, ReplyEnded, UserMessage
from app.cli import build_parser, main
from app.user_error import UserError


def test_a_missing_draft_model_names_the_fetch_command(tmp_path, monkeypatch, capsys):
    """No flags and an empty model cache: exit 2 with the command that fetches the pair."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECWIRE_CONFIG", str(tmp_path / "none.toml"))
    assert main(["chat"]) == 2
    assert "run `specwire models fetch qwen2.5-coder`" in capsys.readouterr().err


def test_a_draft_path_that_is_not_there_is_a_one_line_error(tmp_path, capsys):
    """--draft naming no file: exit 2 before anything loads (the target used to start loading first)."""
    assert main(["chat", "--draft", str(tmp_path / "nope.gguf")]) == 2
    assert f"there is no draft model at {tmp_path / 'nope.gguf'}" in capsys.readouterr().err


def test_bad_flags_and_unknown_chats_are_one_line_errors(tiny, tmp_path, monkeypatch, capsys):
    """A bad temperature or an unknown chat id: exit 2, one line saying what to do."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert main(["chat", "--draft", str(tiny.draft), "--temperature", "-1"]) == 2
    assert "temperature must be between 0 and 100" in capsys.readouterr().err
    assert main(["chat", "--draft", str(tiny.draft), "--resume", "nosuch"]) == 2
    assert "`specwire chat --list` shows them" in capsys.readouterr().err


def test_list_shows_saved_chats_newest_first(tmp_path, monkeypatch, capsys):
    """--list: id, start, turns and the first message of each chat."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert main(["chat", "--list"]) == 0
    assert "no saved chats" in capsys.readouterr().out
    chat = ChatStore(tmp_path / "data" / "specwire" / "chats").create("draft.gguf", "offline")
    chat.write(UserMessage(1, "how do I sort a list?", "t"))
    chat.write(ReplyEnded(1, "eos"))
    chat.close()
    assert main(["chat", "--list"]) == 0
    out = capsys.readouterr().out
    assert chat.id in out and "how do I sort a list?" in out and "specwire chat --resume ID" in out


def test_list_shows_a_title_with_an_escape_sequence_as_text(tmp_path, monkeypatch, capsys):
    """--list prints first messages on a terminal: an escape sequence in one (OSC 52 writes the
    clipboard) is printed as its escape, never as the control character."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    chat = ChatStore(tmp_path / "data" / "specwire" / "chats").create("draft.gguf", "offline")
    chat.write(UserMessage(1, "\x1b]52;c;aGVsbG8=\x07paste me", "t"))
    chat.close()
    assert main(["chat", "--list"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]52;c;aGVsbG8=\\x07paste me" in out


def test_each_chat_process_logs_into_a_file_of_its_own_and_old_logs_are_removed(tmp_path):
    """Two chats at once get two log files (one chat.log interleaved them); only the newest 20 are kept."""
    folder = tmp_path / "state" / "specwire" / "chat-logs"
    folder.mkdir(parents=True)
    for n in range(25):
        (folder / f"chat-20200101-0000{n:02d}-1.log").write_text("old\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    code = "import logging; from app.chat.launch import log_to_file; print(log_to_file(0)); logging.info('hi')"
    paths = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            check=True).stdout.strip() for _ in range(2)]
    assert paths[0] != paths[1] and all(str(os.getpid()) not in p for p in paths)
    assert all("hi" in Path(p).read_text() for p in paths)
    remaining = sorted(f.name for f in folder.glob("chat-*.log"))
    assert len(remaining) == 20 and "chat-20200101-000024-1.log" in remaining
    assert "chat-20200101-000005-1.log" not in remaining


def test_the_config_files_chat_table_sets_defaults_and_flags_win(tiny, tmp_path, monkeypatch):
    """[chat] k, temperature, system and marks become the chat's settings unless a flag says otherwise;
    a wrong value names the file and the key."""
    config = tmp_path / "config.toml"
    config.write_text('[chat]\nk = 2\ntemperature = 0.5\nsystem = "be brief"\nmarks = false\n')
    monkeypatch.setenv("SPECWIRE_CONFIG", str(config))
    store = ChatStore(tmp_path / "chats")
    parse = build_parser().parse_args
    settings = settings_from(parse(["chat", "--draft", str(tiny.draft)]), store)
    assert (settings.k, settings.params.temperature, settings.system, settings.marks) == (2, 0.5, "be brief", False)
    settings = settings_from(parse(["chat", "--draft", str(tiny.draft), "--k", "auto", "--temperature", "0",
                                    "--system", "mine"]), store)
    assert (settings.k, settings.params.temperature, settings.system) == (None, 0.0, "mine")
    config.write_text("")
    settings = settings_from(parse(["chat", "--draft", str(tiny.draft)]), store)
    assert (settings.k, settings.params.temperature, settings.system, settings.marks) == (None, 0.0, None, True)
    for bad, message in (('k = "many"', "[chat] k"), ("temperature = true", "temperature must be a number"),
                         ('marks = "no"', "marks must be true or false"), ("colour = 1", "no setting colour")):
        config.write_text(f"[chat]\n{bad}\n")
        with pytest.raises(UserError, match=re.escape(message)):
            settings_from(parse(["chat", "--draft", str(tiny.draft)]), store)


def test_draft_ngram_takes_a_tokenizer_and_refuses_offline(tiny, tmp_path, monkeypatch, capsys):
    """--draft ngram: the --tokenizer GGUF tokenizes, --mix-ngram mixes, --offline is refused in one line."""
    monkeypatch.setenv("SPECWIRE_CONFIG", str(tmp_path / "none.toml"))
    store = ChatStore(tmp_path / "chats")
    parse = build_parser().parse_args
    settings = settings_from(parse(["chat", "--draft", "ngram", "--tokenizer", str(tiny.draft)]), store)
    assert settings.drafting == "ngram" and settings.draft == tiny.draft
    assert settings_from(parse(["chat", "--draft", str(tiny.draft), "--mix-ngram"]), store).drafting == "mixed"
    assert settings_from(parse(["chat", "--draft", str(tiny.draft)]), store).drafting == "model"
    assert main(["chat", "--draft", "ngram", "--tokenizer", str(tiny.draft), "--offline"]) == 2
    assert "--draft ngram has no local model" in capsys.readouterr().err
