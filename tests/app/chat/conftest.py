"""Fixtures for the chat tests: a tiny service in a child process, settings, and waiting helpers."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.chat.settings import ChatSettings

SPECWIRE = str(Path(sys.executable).parent / "specwire")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests (the Pilot tests) in a fresh event loop, without an asyncio plugin."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        asyncio.run(pyfuncitem.obj(**arguments))
        return True
    return None


def start_tiny_service(target: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`specwire serve` on the tiny GGUF target (llama.cpp: no torch import), port 0; process and URL."""
    process = subprocess.Popen([SPECWIRE, "serve", "--target", str(target), "--backend", "llamacpp", "--port", "0",
                                *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    assert line.startswith("listening on ws://127.0.0.1:"), line
    return process, line.split()[-1]


@pytest.fixture(scope="module")
def tiny_service(tiny):
    """A tiny verification service shared by a module's tests (remote mode)."""
    process, url = start_tiny_service(tiny.target_gguf)
    yield url
    process.kill()
    process.wait()


@pytest.fixture
def chat_settings(tiny, tmp_path):
    """make(**overrides): ChatSettings on the tiny models, greedy, saving under tmp_path."""

    def make(**overrides) -> ChatSettings:
        values = dict(draft=tiny.draft, target=str(tiny.target_gguf), backend="llamacpp", max_tokens=48,
                      chats_dir=tmp_path / "chats", steady_display=True, seed=0,
                      # rounds of a fixed k: a stream's marks follow timings, and the marks on screen with them
                      # (the default mode has tests of its own: test_engine.py, test_tmux.py)
                      mode="rounds", k=4)
        values.update(overrides)
        return ChatSettings(**values)

    return make


async def wait_for(pilot, condition, timeout_s: float = 120.0, what: str = "") -> None:
    """Let the app run until `condition()` holds; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.05)


def wait_until(condition, timeout_s: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.05)


async def send(pilot, text: str) -> None:
    """Type `text` into the prompt box and press Enter."""
    from app.chat.widgets.prompt_input import PromptInput

    prompt = pilot.app.screen.query_one(PromptInput)
    prompt.focus()  # applied on a later tick: wait for it, or Enter goes elsewhere
    await wait_for(pilot, lambda: prompt.has_focus, what="the prompt box to have the focus")
    prompt.load_text(text)
    await pilot.press("enter")


async def answered(pilot, text: str):
    """Send `text` and wait until its reply has finished (however fast); the reply's widget."""
    from app.chat.widgets.assistant_turn import AssistantTurn

    screen = pilot.app.chat_screen
    before = len(screen.query(AssistantTurn))
    await send(pilot, text)

    def finished() -> bool:
        turns = screen.query(AssistantTurn)
        return len(turns) > before and turns.last().finished and not screen.replying

    await wait_for(pilot, finished, what=f"the reply to {text!r}")
    return screen.query(AssistantTurn).last()
