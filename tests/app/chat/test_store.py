"""Saved chats: events round-trip, a torn last line is skipped, chats are listed and found by id."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from app.chat.conversation import Conversation
from app.chat.store import ChatInUse, ChatNotFound, ChatStore, Committed, Note, ReplyEnded, SystemPrompt, UserMessage


def _chat_with_one_turn(store: ChatStore, text: str = "hello"):
    chat = store.create("draft.gguf", "ws://127.0.0.1:1")
    chat.write(SystemPrompt("be brief"))
    chat.write(UserMessage(1, text, "2026-01-01T00:00:00+00:00"), durable=True)
    chat.write(Committed(1, [5, 6, 7], "ddt", ["a", "b", "c"]))
    chat.write(Note(1, "lost the service"))
    chat.write(Committed(1, [8], "o", ["d"]))
    chat.write(ReplyEnded(1, "eos", {"rounds": 2}), durable=True)
    return chat


def test_a_chat_replays_into_the_same_conversation(tmp_path):
    """Every event written comes back: system prompt, message, tokens with provenance, notes, end."""
    store = ChatStore(tmp_path)
    chat = _chat_with_one_turn(store)
    chat.close()
    conversation = Conversation.load(chat.path)
    assert conversation.chat_id == chat.id and conversation.system == "be brief"
    (turn,) = conversation.turns
    assert turn.user == "hello" and turn.reply.text == "abcd"
    assert turn.reply.token_ids == [5, 6, 7, 8]
    assert turn.reply.provenance == ["draft", "draft", "target", "offline"]
    assert turn.reply.notes == ["lost the service"] and turn.reply.stop_reason == "eos"
    assert turn.reply.stats == {"rounds": 2}


def test_every_event_is_on_disk_before_the_file_is_closed(tmp_path):
    """A crash loses nothing written: another reader sees each event at once."""
    store = ChatStore(tmp_path)
    chat = store.create("draft.gguf", "offline")
    chat.write(UserMessage(1, "hi", "t"))
    chat.write(Committed(1, [1], "o", ["x"]))
    conversation = Conversation.load(chat.path)  # the file is still open for appending
    assert conversation.turns[0].reply.text == "x" and conversation.turns[0].reply.stop_reason is None
    chat.close()


def test_a_torn_last_line_is_skipped(tmp_path):
    """Half a line at the end (a crash mid-write) is ignored; the rest of the chat loads."""
    store = ChatStore(tmp_path)
    chat = _chat_with_one_turn(store)
    chat.close()
    with open(chat.path, "ab") as file:
        file.write(b'{"type":"tokens","turn":1,"ids":[9')
    conversation = Conversation.load(chat.path)
    assert conversation.turns[0].reply.text == "abcd"


def test_chats_are_listed_newest_first_and_found_by_id_prefix_or_as_the_latest(tmp_path):
    """--list order, --resume ID (a unique start is enough), --resume alone: the latest."""
    store = ChatStore(tmp_path)
    older = _chat_with_one_turn(store, "first chat\nsecond line")
    older.close()
    past = time.time() - 100
    os.utime(older.path, (past, past))
    newer = _chat_with_one_turn(store, "second chat")
    newer.close()
    summaries = store.list()
    assert [s.id for s in summaries] == [newer.id, older.id]
    assert summaries[1].title == "first chat" and summaries[1].turns == 1
    assert store.path_of(None) == newer.path
    assert store.path_of(older.id) == older.path
    for name in ("20260101-000000-aaaa", "20260102-000000-bbbb"):
        (tmp_path / f"{name}.jsonl").write_bytes(older.path.read_bytes())
    assert store.path_of("20260101").stem == "20260101-000000-aaaa"
    with pytest.raises(ChatNotFound, match="matches 2 chats"):
        store.path_of("202601")
    with pytest.raises(ChatNotFound, match="--list"):
        store.path_of("nosuchchat")
    with pytest.raises(ChatNotFound, match="no saved chat"):
        ChatStore(tmp_path / "empty").path_of(None)


def test_resume_without_an_id_skips_a_newer_chat_open_in_another_process(tmp_path):
    """Two chats at once: the other process's newer, open chat is not the one `--resume` picks, and
    naming it is refused; once that process ends (even by kill -9) it is the latest again."""
    store = ChatStore(tmp_path)
    mine = _chat_with_one_turn(store, "mine")
    mine.close()
    os.utime(mine.path, (time.time() - 60, time.time() - 60))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from app.chat.store import ChatStore;"
         "c = ChatStore(Path(sys.argv[1])).create('draft.gguf', 'offline'); print(c.id, flush=True); time.sleep(60)",
         str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        theirs = holder.stdout.readline().strip()
        assert store.list()[0].id == theirs  # newer
        assert store.path_of(None) == mine.path
        with pytest.raises(ChatInUse, match="open in another"):
            store.path_of(theirs)
        with pytest.raises(ChatInUse):
            store.reopen(theirs)
    finally:
        holder.kill()
        holder.wait()
    assert store.path_of(None).stem == theirs


def test_saved_chats_are_readable_by_their_owner_only(tmp_path):
    """A chat file is created 0600 and its folder 0700 whatever the umask; a folder an older version
    made 0755 is narrowed to 0700 when the next chat is created in it."""
    old_umask = os.umask(0o022)
    try:
        store = ChatStore(tmp_path / "new" / "chats")
        chat = _chat_with_one_turn(store)
        chat.close()
        assert (chat.path.stat().st_mode & 0o777, store.root.stat().st_mode & 0o777) == (0o600, 0o700)
        older = tmp_path / "older"
        older.mkdir(mode=0o755)
        older.chmod(0o755)
        chat = ChatStore(older).create("draft.gguf", "offline")
        chat.close()
        assert (chat.path.stat().st_mode & 0o777, older.stat().st_mode & 0o777) == (0o600, 0o700)
    finally:
        os.umask(old_umask)
