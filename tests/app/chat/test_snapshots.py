"""Screens at a fixed terminal size, compared with approved SVG snapshots (pytest-textual-snapshot).

Deterministic by construction: greedy decoding, seeded, the tiny models, and the steady
display (no timings, no blinking cursor). Update after a deliberate change with
`python -m pytest tests/app/chat/test_snapshots.py --snapshot-update`, then look at the SVGs.
"""

from __future__ import annotations

from app.chat.chat_app import ChatApp
from app.chat.problem_screen import ProblemScreen
from tests.app.chat.conftest import answered, send, wait_for

SIZE = (100, 34)


async def _answer(pilot, text: str) -> None:
    await wait_for(pilot, lambda: pilot.app.chat_screen.ready, what="the chat to start")
    await answered(pilot, text)


def test_snapshot_a_verified_reply_with_provenance_marks_and_stats(snap_compare, chat_settings):
    """Embedded service: the reply coloured by provenance, its summary, the status line, /stats."""

    async def run_before(pilot) -> None:
        await _answer(pilot, "def quicksort(arr):")
        await send(pilot, "/stats")

    assert snap_compare(ChatApp(chat_settings(max_tokens=32)), terminal_size=SIZE, run_before=run_before)


def test_snapshot_an_offline_reply_as_markdown_with_help(snap_compare, chat_settings):
    """Offline: marks off (rendered Markdown), then /help."""

    async def run_before(pilot) -> None:
        await _answer(pilot, "hello")
        await pilot.press("ctrl+t")
        await send(pilot, "/help")

    assert snap_compare(ChatApp(chat_settings(offline=True, max_tokens=24)), terminal_size=SIZE,
                        run_before=run_before)


def test_snapshot_an_unreachable_service_offers_offline(snap_compare, chat_settings):
    """The start-up dialog for a service that is not there."""

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ProblemScreen), what="the dialog")

    assert snap_compare(ChatApp(chat_settings(server="ws://127.0.0.1:9")), terminal_size=SIZE,
                        run_before=run_before)
