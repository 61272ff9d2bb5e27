"""A reply in each of its states, driven by Pilot: sent before the engine can take it, waiting for
the service, waiting for its first token, and esc in each of them; tiny models, real services.

A service slow to come up (or to reconnect) is stood for by holding the engine's real `start`
or `connect` until the test lets it go: the wait is the test's, the service behind it is real.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

from textual import events

from app.chat.chat_app import ChatApp
from app.chat.engine import ChatEngine
from app.chat.problem_screen import ProblemScreen
from app.chat.widgets.assistant_turn import AssistantTurn
from app.chat.widgets.prompt_input import PromptInput
from app.chat.widgets.status_line import StatusLine
from app.chat.widgets.turns import Notice, UserTurn
from tests.app.chat.conftest import send, wait_for

SIZE = (100, 32)


def _plain(widget) -> str:
    return str(widget.render())


def hold(engine: ChatEngine, name: str) -> threading.Event:
    """Make the engine's `name` (start, connect) wait until the returned event is set."""
    release = threading.Event()
    call = getattr(engine, name)

    def held(*args, **kwargs):
        release.wait(60)
        return call(*args, **kwargs)

    setattr(engine, name, held)
    return release


async def send_while_starting(pilot, text: str) -> None:
    """Type `text` into the prompt box before the chat is ready, and press Enter."""
    prompt = pilot.app.chat_screen.query_one(PromptInput)
    await wait_for(pilot, lambda: prompt.has_focus, timeout_s=10, what="the prompt box to take text while starting")
    assert not pilot.app.chat_screen.ready
    prompt.load_text(text)
    await pilot.press("enter")


async def shown_waiting(pilot, text: str) -> AssistantTurn:
    """The message is on screen as the user's turn, an empty reply under it; that reply."""
    screen = pilot.app.chat_screen
    await wait_for(pilot, lambda: screen.query(UserTurn), timeout_s=10, what="the message on screen at once")
    assert _plain(screen.query(UserTurn).last().query_one(".body")) == text
    assert screen.query_one(PromptInput).text == ""
    return screen.stream.current


def _saved_messages(app: ChatApp) -> list[str]:
    path = app.engine.chat.path
    return [event["text"] for event in map(json.loads, path.read_text().splitlines()) if event["type"] == "user"]


async def test_a_message_sent_while_the_chat_starts_is_answered_when_the_service_is_ready(chat_settings, tiny_service):
    """Sent before the service is up: shown at once as the user's turn with the wait for the service
    under it and in the status line; answered, verified, once the service is ready."""
    app = ChatApp(chat_settings(server=tiny_service))
    release = hold(app.engine, "start")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await send_while_starting(pilot, "def quicksort(arr):")
            reply = await shown_waiting(pilot, "def quicksort(arr):")
            assert "waiting for the verification service" in _plain(reply.query_one(".waiting"))
            status = _plain(app.screen.query_one(StatusLine))
            assert "starting" in status and "waiting for the verification service" in status
            release.set()
            screen = app.chat_screen
            await wait_for(pilot, lambda: screen.ready and reply.finished and not screen.replying, what="the answer")
            assert len(reply.reply.provenance) == 48 and set(reply.reply.provenance) <= {"draft", "target"}
            await wait_for(pilot, lambda: screen.query_one(PromptInput).has_focus, timeout_s=10, what="the focus")
            assert _saved_messages(app) == ["def quicksort(arr):"]
    finally:
        release.set()


async def test_esc_while_waiting_for_the_service_takes_the_message_back_into_the_box(chat_settings, tiny_service):
    """Esc before the service is up: the waiting message leaves the transcript for the prompt box, a
    notice says it was not sent, and nothing is generated or saved when the service comes."""
    app = ChatApp(chat_settings(server=tiny_service))
    release = hold(app.engine, "start")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await send_while_starting(pilot, "tell me a story")
            await shown_waiting(pilot, "tell me a story")
            await pilot.press("escape")
            screen = app.chat_screen
            await wait_for(pilot, lambda: not screen.replying, timeout_s=10, what="the message taken back")
            assert not screen.query(UserTurn) and not screen.query(AssistantTurn)
            assert screen.query_one(PromptInput).text == "tell me a story"
            assert "not sent" in _plain(screen.query(Notice).last())
            release.set()
            await wait_for(pilot, lambda: screen.ready, what="the chat to start")
            await pilot.pause(0.5)
            assert not screen.replying and not app.engine.conversation.turns and app.engine.chat is None
    finally:
        release.set()


async def test_a_message_waiting_for_a_service_that_never_comes_is_answered_offline(chat_settings):
    """The service cannot be reached while a message waits: no dialog, the message is answered
    offline, its tokens marked unverified, and a note under it says why."""
    app = ChatApp(chat_settings(server="ws://127.0.0.1:9", max_tokens=16))
    release = hold(app.engine, "start")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await send_while_starting(pilot, "hello")
            reply = await shown_waiting(pilot, "hello")
            release.set()
            screen = app.chat_screen
            await wait_for(pilot, lambda: screen.ready and reply.finished and not screen.replying, what="the answer")
            assert not isinstance(app.screen, ProblemScreen)
            assert len(reply.reply.provenance) == 16 and set(reply.reply.provenance) == {"offline"}
            notes = _plain(reply.query_one(".notes"))
            assert "did not come" in notes and "cannot reach the verification service" in notes
            assert _plain(screen.query_one(StatusLine)).startswith("offline")
            assert _saved_messages(app) == ["hello"]
    finally:
        release.set()


async def test_a_message_sent_while_the_chat_reconnects_is_answered_once_it_is_online(chat_settings, tiny_service):
    """/online from offline: a message sent while it connects is shown at once, waiting, and
    answered verified when the connection is made (it was refused with a warning)."""
    app = ChatApp(chat_settings(server=tiny_service, offline=True))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.chat_screen
        await wait_for(pilot, lambda: screen.ready, what="the chat to start")
        release = hold(app.engine, "connect")
        try:
            await send(pilot, "/online")
            await wait_for(pilot, lambda: screen.working, timeout_s=10, what="the chat to connect")
            await send(pilot, "def quicksort(arr):")
            reply = await shown_waiting(pilot, "def quicksort(arr):")
            assert "waiting for the chat (connecting" in _plain(reply.query_one(".waiting"))
            release.set()
            await wait_for(pilot, lambda: reply.finished and not screen.replying, what="the answer")
        finally:
            release.set()
        assert app.engine.mode == "hybrid"
        assert len(reply.reply.provenance) == 48 and set(reply.reply.provenance) <= {"draft", "target"}


async def test_esc_before_the_replys_worker_thread_starts_still_stops_it(chat_settings, tiny_service):
    """Esc while a reply waits for its first token, before its worker thread has begun (the
    executor busy with other work): the reply stops before its first round. The worker used to
    clear the stop flag when it began, losing that esc: the reply ran to its end."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))  # Textual's threads
    app = ChatApp(chat_settings(server=tiny_service, max_tokens=3000))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.chat_screen
        await wait_for(pilot, lambda: screen.ready, what="the chat to start")
        busy = threading.Event()
        occupied = asyncio.get_running_loop().run_in_executor(None, busy.wait, 60)
        try:
            await send(pilot, "tell me everything")
            await wait_for(pilot, lambda: screen.replying and screen.stream.current is not None, timeout_s=10)
            reply = screen.stream.current
            await pilot.press("escape")
            await wait_for(pilot, lambda: "stopping" in _plain(screen.query_one(StatusLine)), timeout_s=10)
        finally:
            busy.set()
            await occupied
        await wait_for(pilot, lambda: reply.finished and not screen.replying, what="the reply to end")
        assert reply.reply.stop_reason == "stopped" and reply.reply.provenance == []


async def test_what_is_typed_while_a_reply_streams_is_kept_for_the_next_message(chat_settings, tiny_service):
    """The box stays enabled while a reply streams: keys typed then stay in it, Enter says to wait and
    keeps them, and they are sent once the reply has ended. A disabled box dropped those keys."""
    app = ChatApp(chat_settings(server=tiny_service, max_tokens=3000))
    streaming = threading.Event()  # set: the reply streams on; clear: it holds after 5 tokens, as a slow one
    committed = app.engine.listener.committed

    def slow_committed(turn, provenance, pieces, stats) -> None:
        committed(turn, provenance, pieces, stats)  # on the engine's worker, as each round commits
        if stats.generated >= 5:
            streaming.wait(30)

    app.engine.listener.committed = slow_committed
    try:
        async with app.run_test(size=SIZE) as pilot:
            screen = app.chat_screen
            prompt = screen.query_one(PromptInput)
            await wait_for(pilot, lambda: screen.ready and prompt.has_focus, what="the chat to start")
            await send(pilot, "tell me everything")
            await wait_for(pilot, lambda: screen.stream.current is not None
                           and len(screen.stream.current.reply.pieces) >= 5, what="the reply to stream")
            await pilot.press("n", "e", "x", "t", "space", "o", "n", "e")
            assert screen.replying and prompt.text == "next one"
            await pilot.press("enter")
            assert prompt.text == "next one" and "wait for the reply to end" in _plain(screen.query(Notice).last())
            await pilot.press("escape")
            streaming.set()
            await wait_for(pilot, lambda: not screen.replying, what="the reply to stop")
            assert screen.query(AssistantTurn).last().reply.stop_reason == "stopped"
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(screen.query(AssistantTurn)) == 2 and screen.replying,
                           what="the second reply")
            assert prompt.text == "" and _plain(screen.query(UserTurn).last().query_one(".body")) == "next one"
            await pilot.press("escape")
            await wait_for(pilot, lambda: not screen.replying, what="the second reply to stop")
            assert _saved_messages(app) == ["tell me everything", "next one"]
    finally:
        streaming.set()


async def test_esc_typed_with_the_enter_that_starts_a_reply_stops_it(chat_settings, tiny_service):
    """Enter and esc queued on the prompt box together, as a terminal delivers keys pressed in quick
    succession: the reply that Enter starts is stopped. The esc used to reach the screen before
    the Enter's Submitted, found no reply to stop, and the reply ran to its limit."""
    app = ChatApp(chat_settings(server=tiny_service, max_tokens=3000))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.chat_screen
        prompt = screen.query_one(PromptInput)
        await wait_for(pilot, lambda: screen.ready and prompt.has_focus, what="the chat to start")
        prompt.load_text("tell me everything")
        for key, character in (("enter", "\r"), ("escape", "\x1b")):  # as the app forwards keys to the focus
            prompt._forward_event(events.Key(key, character))
        # the reply's turn, found on the screen: stopped at once, it can start and end between two
        # looks at `stream.current` (which is cleared when a reply ends)
        await wait_for(pilot, lambda: screen.query(AssistantTurn), timeout_s=10, what="the reply")
        reply = screen.query(AssistantTurn).last()
        await wait_for(pilot, lambda: reply.finished and not screen.replying, what="the reply to end")
        assert reply.reply.stop_reason == "stopped" and len(reply.reply.provenance) < 3000
