"""A fake verification service: a real WebSocket server (specwire.v1) whose answers a test scripts.

It stands in for a malicious or broken service, which the real one cannot be made into: it
welcomes any Hello, then answers each client frame with what `answer(message, state)`
returns (a list of server messages, sent in order). The client under test is the real one.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Callable

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from wire.protocol import (
    SUBPROTOCOL, Generate, Generated, Hello, Sync, Synced, Verdict, Verify, Welcome, decode_client_message, encode,
)


@dataclass
class FakeState:
    """What a fake session knows: the history the client sent, and how many rounds it answered."""

    hello: Hello | None = None
    committed: list[int] = field(default_factory=list)
    rounds: int = 0


Answer = Callable[[object, FakeState], list]


def honest_answer(token: int = 5) -> Answer:
    """Answers that a real service could give: every draft rejected, `token` as the correction."""

    def answer(message, state: FakeState) -> list:
        if isinstance(message, Sync):
            state.committed = list(message.tokens)
            return [Synced(seq=message.seq, committed_len=len(state.committed))]
        if isinstance(message, Verify):
            state.committed += list(message.append) + [token]
            return [Verdict(seq=message.seq, accepted=0, token=token, committed_len=len(state.committed))]
        if isinstance(message, Generate):
            state.committed += list(message.append) + [token]
            return [Generated(seq=message.seq, tokens=[token], committed_len=len(state.committed), done=True,
                              stop_reason="max_tokens")]
        return []

    return answer


class FakeService:
    def __init__(self, answer: Answer, welcome: Callable[[Hello], Welcome] | None = None, host: str = "127.0.0.1",
                 port: int = 0, welcome_delay_s: float = 0.0):
        self.answer = answer
        self.welcome = welcome or (lambda hello: Welcome(session_id="fake", max_context=4096, max_draft=16,
                                                         vocab_size=hello.vocab_size, target="fake-target"))
        self.sessions: list[FakeState] = []  # one per Hello received
        self.connections = 0  # WebSocket upgrades, with a Hello or not
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Future | None = None
        self.port = port
        self.host = host
        self.welcome_delay_s = welcome_delay_s  # the Welcome comes this late (pings are answered meanwhile)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the fake service did not start"
        self.url = f"ws://{host}:{self.port}"

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = self._loop.create_future()
        async with serve(self._handle, self.host, self.port, subprotocols=[SUBPROTOCOL]) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop

    async def _handle(self, ws) -> None:
        self.connections += 1
        state = FakeState()
        try:
            state.hello = decode_client_message(await ws.recv())
        except ConnectionClosed:  # a client that checked the upgrade and left
            return
        self.sessions.append(state)
        await asyncio.sleep(self.welcome_delay_s)
        await ws.send(encode(self.welcome(state.hello)))
        async for frame in ws:
            message = decode_client_message(frame)
            for reply in self.answer(message, state):
                await ws.send(reply if isinstance(reply, bytes) else encode(reply))
            state.rounds += 1

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(10)
