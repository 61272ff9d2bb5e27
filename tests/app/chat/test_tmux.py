"""The real `specwire chat` in a real terminal: tmux send-keys in, capture-pane out, tiny models.

One run through what a user does: answer a prompt (marks and status line), lose the
embedded service mid-reply (the offline notice, the reply completed, unverified tokens
marked), quit, resume the whole conversation, stop a reply with esc and send another (a
5,000-character paste, answered verified), switch to the Markdown view and get a reply there,
and SIGKILL the chat (its service goes too). A second run types before the service is up.
tmux is installed by `packaging/install.sh --dev`; without it this test fails, it does not skip.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.app.chat.conftest import SPECWIRE, wait_until

WIDTH, HEIGHT = 120, 60


class Tmux:
    """A private tmux server (its own socket) running one command in one pane."""

    def __init__(self, socket: str):
        self.socket = socket

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self, name: str, command: str, height: int = HEIGHT) -> None:
        # The shell keeps the pane open after the chat exits, so its last words can be read.
        # COLUMNS/LINES are dropped: a detached pane's shell can hand down 80x24 from before
        # the pane took its size, and they would override the terminal's real size.
        self("new-session", "-d", "-s", name, "-x", str(WIDTH), "-y", str(height),
             f"env -u COLUMNS -u LINES {command}; echo CHAT-EXITED $?; sleep 600")

    def screen(self, name: str, colours: bool = False) -> str:
        return self("capture-pane", "-p", *(["-e"] if colours else []), "-t", name)

    def wait_for(self, name: str, pattern: str, timeout_s: float = 90) -> str:
        found = []

        def seen() -> bool:
            text = self.screen(name)
            found[:] = [text]
            return re.search(pattern, text) is not None

        try:
            wait_until(seen, timeout_s, pattern)
        except AssertionError:
            raise AssertionError(f"{pattern!r} never appeared; the screen:\n{found[0] if found else ''}") from None
        return found[0]

    def pane_pid(self, name: str) -> int:
        return int(self("display-message", "-p", "-t", name, "#{pane_pid}").strip())


def _shows(pattern: str, screen: str) -> None:
    assert re.search(pattern, screen), f"{pattern!r} is not on the screen:\n{screen}"


def _descendants(pid: int) -> dict[int, str]:
    """Every live process under pid: {pid: command line} (from /proc: ps would cut long lines)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # not a process, or gone meanwhile
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            children.setdefault(int(parent), []).append((int(entry.name), args))
    found, todo = {}, [pid]
    while todo:
        for child, args in children.get(todo.pop(), []):
            found[child] = args
            todo.append(child)
    return found


def _saved_events(data_home: Path) -> list[dict]:
    (chat,) = (data_home / "specwire" / "chats").glob("*.jsonl")
    return [json.loads(line) for line in chat.read_text().splitlines() if line.endswith("}")]


def _saved_tokens(data_home: Path, turn: int) -> int:
    """Tokens of a turn's reply committed so far, read from the chat's file as it is written."""
    return sum(len(e["ids"]) for e in _saved_events(data_home) if e["type"] == "tokens" and e["turn"] == turn)


def _saved_end(data_home: Path, turn: int) -> dict | None:
    """The end event of a turn's reply, once it ended."""
    return next((e for e in _saved_events(data_home) if e["type"] == "end" and e["turn"] == turn), None)


def _stream_then(tmux: Tmux, name: str, data_home: Path, turn: int, key: str) -> None:
    """Once the reply of `turn` has its first token on file (polled fast: tiny replies are quick), press
    `key`. (Waiting for ten let the tiny target's 400 tokens end first on a busy machine, three times
    running, with another test worker beside the chat.)"""
    deadline = time.monotonic() + 120
    while _saved_tokens(data_home, turn) < 1:
        assert time.monotonic() < deadline, f"the reply of turn {turn} did not stream"
        time.sleep(0.01)
    tmux("send-keys", "-t", name, key)


PASTE = ("The quick brown fox jumps over the lazy dog while the sorting function walks the array. " * 60)[:5000]


def _service_pid(tmux: Tmux, name: str) -> int:
    (pid,) = [p for p, args in _descendants(tmux.pane_pid(name)).items() if "--exit-with-parent" in args]
    return pid


def _chat_pid(tmux: Tmux, name: str) -> int:
    (pid,) = [p for p, args in _descendants(tmux.pane_pid(name)).items() if " chat " in args and "serve" not in args]
    return pid


@pytest.fixture
def tmux(tmp_path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: `bash packaging/install.sh --dev` installs it (apt-get install tmux)")
    server = Tmux(f"specwire-test-{os.getpid()}")
    yield server
    socket = subprocess.run(["tmux", "-L", server.socket, "display-message", "-p", "#{socket_path}"],
                            capture_output=True, text=True).stdout.strip()
    subprocess.run(["tmux", "-L", server.socket, "kill-server"], capture_output=True)
    if socket:
        Path(socket).unlink(missing_ok=True)  # tmux leaves it behind


def test_the_real_chat_in_tmux_answers_goes_offline_resumes_and_leaves_no_service_behind(tiny, tmp_path, tmux):
    """Prompt -> marked reply and status; kill -9 of the service mid-reply -> offline notice, completed
    reply, unverified marks; ctrl+q and --resume -> the whole conversation; kill -9 of the chat -> no orphan."""
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    models = f"--draft {tiny.draft} --target {tiny.target_gguf} --backend llamacpp --max-tokens 400"
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f" {SPECWIRE} chat {models}"

    tmux.start("first", command)
    tmux.wait_for("first", r"● embedded service")
    tmux("send-keys", "-t", "first", "def quicksort(arr):", "Enter")
    screen = tmux.wait_for("first", r"400 tokens: \d+ draft, \d+ target ·")
    assert "You" in screen and "def quicksort(arr):" in screen and "Assistant" in screen
    # "(k)" is the last pass's verified guesses, absent when there were none; the acceptance is shown once
    # something was drafted (beside a service on these two cores the drafter mostly rests: the stream alone)
    _shows(r"hybrid │ ● embedded service │ rtt \d+ ms │ k auto( \(\d+\))?( │ accept \d+%)? │ tok/round [\d.]+", screen)
    assert "■ draft  ■ target  ■ unverified" in screen
    coloured = tmux.screen("first", colours=True)
    assert "\x1b[1m" in coloured and coloured.count("\x1b[38;") > 10  # bold target tokens, coloured text

    # kill -9 of the service mid-reply. The tiny target streams 400 tokens in about a second: on a
    # machine busy with other work the reply can end before the kill lands (it is then all verified),
    # and the chat restarts its service: then another message is sent, three at most.
    turn = 2
    for _ in range(3):
        service = _service_pid(tmux, "first")
        tmux("send-keys", "-t", "first", "tell me more", "Enter")
        deadline = time.monotonic() + 120
        while _saved_tokens(tmp_path / "data", turn=turn) < 10:  # polled fast: tiny replies are quick
            assert time.monotonic() < deadline, f"the reply of turn {turn} did not stream"
            time.sleep(0.01)
        os.kill(service, signal.SIGKILL)
        wait_until(lambda: _saved_end(tmp_path / "data", turn) is not None, 120, f"the end of turn {turn}")
        if _saved_end(tmp_path / "data", turn)["stats"]["offline"] > 0:
            break
        wait_until(lambda: [p for p, a in _descendants(tmux.pane_pid("first")).items()
                            if "--exit-with-parent" in a and p != service], 60, "the restarted service")
        turn += 1
    else:
        pytest.fail("the service was never killed mid-reply in 3 tries")
    screen = tmux.wait_for("first", r"400 tokens: \d+ draft, \d+ target, \d+ unverified")
    assert "lost the verification service: continuing offline, unverified tokens are marked" in screen
    # italic and underlined (tmux may reset first: 0;3;4): the legend's "unverified", and the offline tokens
    assert len(re.findall(r"\x1b\[(?:0;)?3;4m", tmux.screen("first", colours=True))) >= 2

    tmux("send-keys", "-t", "first", "C-q")
    screen = tmux.wait_for("first", r"CHAT-EXITED 0")
    chat_id = re.search(r"specwire chat --resume (\S+)", screen).group(1)
    assert not [p for p, a in _descendants(tmux.pane_pid("first")).items() if "--exit-with-parent" in a]

    tmux.start("resumed", command + " --resume")
    screen = tmux.wait_for("resumed", r"● embedded service")
    assert f"resumed chat {chat_id}: {turn} turns" in screen
    assert "def quicksort(arr):" in screen and "tell me more" in screen
    assert len(re.findall(r"400 tokens:", screen)) >= 2 and "lost the verification service" in screen

    # esc mid-reply, then a second message: a 5,000-character paste, answered verified. The tiny
    # target streams its 400 tokens in about a second; on a machine busy with other work the reply
    # can end before the key reaches the chat (it then ends at the length limit, and esc on an
    # ended reply does nothing): then another message is sent, six at most (three ran out once in a
    # full suite on two cores).
    turn += 1
    for _ in range(6):
        tmux("send-keys", "-t", "resumed", "tell me a story", "Enter")
        _stream_then(tmux, "resumed", tmp_path / "data", turn, "Escape")
        wait_until(lambda: _saved_end(tmp_path / "data", turn) is not None, 120, f"the end of turn {turn}")
        reason = _saved_end(tmp_path / "data", turn)["stop_reason"]
        if reason == "stopped":
            break
        assert reason in ("max_tokens", "eos"), reason
        turn += 1
    else:
        pytest.fail("esc never stopped a reply in 6 tries")
    tmux.wait_for("resumed", r"stopped\s+by\s+you")  # the summary line may wrap
    tmux("set-buffer", "-b", "paste", PASTE)
    tmux("paste-buffer", "-p", "-b", "paste", "-t", "resumed")  # bracketed, as a terminal pastes
    tmux.wait_for("resumed", r"lazy dog while the sorting")
    tmux("send-keys", "-t", "resumed", "Enter")
    wait_until(lambda: _saved_end(tmp_path / "data", turn + 1) is not None, 180, "the reply to the paste")
    pasted = next(e for e in _saved_events(tmp_path / "data") if e["type"] == "user" and e["turn"] == turn + 1)
    assert pasted["text"] == PASTE
    end = _saved_end(tmp_path / "data", turn + 1)
    assert end["stats"]["offline"] == 0 and end["stats"]["generated"] > 0 and end["stats"]["prompt_tokens"] > 3000
    screen = tmux.wait_for("resumed", r"\d+ tokens: \d+ draft, \d+ target( ·|\n)")
    assert "unverified" not in screen.split("lazy dog")[-1]

    # ctrl+t: replies rendered as Markdown; one streams and ends, and the prompt box takes text again
    tmux("send-keys", "-t", "resumed", "C-t")
    tmux.wait_for("resumed", r"Markdown \(ctrl\+t\)")
    tmux("send-keys", "-t", "resumed", "def quicksort(arr):", "Enter")
    wait_until(lambda: _saved_end(tmp_path / "data", turn + 2) is not None, 180, "the reply in the Markdown view")
    # the footer drops "esc Stop" when the screen has handled the reply's end (the box is enabled)
    wait_until(lambda: "Stop" not in tmux.screen("resumed").rstrip().splitlines()[-1], 60, "the footer without esc")
    tmux("send-keys", "-t", "resumed", "still typing")  # a screen hung mid-update would not show it
    tmux.wait_for("resumed", r"still typing")

    service = _service_pid(tmux, "resumed")
    os.kill(_chat_pid(tmux, "resumed"), signal.SIGKILL)
    tmux.wait_for("resumed", r"CHAT-EXITED 137")

    def gone() -> bool:
        try:
            os.kill(service, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{service}/stat").read_text().split(")")[-1].split()[0] == "Z"

    wait_until(gone, 20, "the service of the killed chat to stop")


def test_a_message_typed_before_the_service_is_up_is_kept_and_esc_stops_a_reply_at_once(tiny, tmp_path, tmux):
    """120x40, the tiny Hugging Face target (the service takes seconds to load torch): a message typed
    while the chat starts shows at once, waiting; esc at once takes it back into the box; Enter sends
    it again and it is answered once the service is up; a reply with esc pressed at once stops."""
    data = tmp_path / "data"
    env = {"XDG_DATA_HOME": str(data), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    command = (" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
               + f" {SPECWIRE} chat --draft {tiny.draft} --target {tiny.target} --max-tokens 400")
    tmux.start("early", command, height=40)
    tmux.wait_for("early", r"waiting for the verification service")
    tmux("send-keys", "-t", "early", "def quicksort(arr):", "Enter")
    # shown at once, waiting, while the status line still says the chat is starting
    tmux.wait_for("early", r"You\s+▌ def quicksort\(arr\):\s+Assistant\s+waiting for the verification service"
                           r"[\s\S]*○ starting .*waiting for the verification service", timeout_s=15)

    tmux("send-keys", "-t", "early", "Escape")
    tmux.wait_for("early", r"not sent: the message is back in the box", timeout_s=15)
    # the notice and the taken-back turn are drawn in one update, which a capture may catch half
    # way: what is asserted is the screen once it has settled
    screens = []
    settled = lambda: screens.append(tmux.screen("early")) or ("You" not in screens[-1]  # noqa: E731
                                                               and re.search(r"│ def quicksort\(arr\):", screens[-1]))
    wait_until(settled, 5, "the message back in the box, its turn gone")

    tmux("send-keys", "-t", "early", "Enter")  # the text is in the box: sent again
    chats = data / "specwire" / "chats"  # the chat is saved from its first message on
    wait_until(lambda: any(chats.glob("*.jsonl")) and _saved_end(data, 1) is not None, 180,
               "the answer to the message typed while starting")
    assert [e["text"] for e in _saved_events(data) if e["type"] == "user"] == ["def quicksort(arr):"]
    assert _saved_end(data, 1)["stats"]["offline"] == 0  # verified: it waited for the service

    # the footer drops "esc Stop" when the screen has handled the reply's end (the box is enabled)
    wait_until(lambda: "Stop" not in tmux.screen("early").rstrip().splitlines()[-1], 60, "the footer without esc")
    tmux("send-keys", "-t", "early", "tell me a long story", "Enter", "Escape")
    wait_until(lambda: _saved_end(data, 2) is not None, 120, "the reply stopped at once")
    end = _saved_end(data, 2)
    assert end["stop_reason"] == "stopped" and _saved_tokens(data, 2) < 400
    tmux.wait_for("early", r"stopped\s+by\s+you")
    tmux("send-keys", "-t", "early", "C-q")
    tmux.wait_for("early", r"CHAT-EXITED 0")
