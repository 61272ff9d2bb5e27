"""The client's hold on a verification service: connected, or down and reconnecting.

A link is made connected (the first connection happens in the constructor, so a wrong URL,
a refused token or a vocabulary mismatch is an error the caller sees at once). When the
speculation loop loses the service mid-reply it calls `lost()`; the link then reconnects
on a background thread with exponential backoff. The loop waits up to the link's
`takeover_wait_s` for that (another replica behind a load balancer takes the session over in a
moment), then keeps generating offline until `current()` hands it a fresh client. A fresh client means a fresh service-side
session: the loop rebuilds it from its own history, which is why any replica will do.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from local_draft.verify_client import ServiceBusy, ServiceUnreachable, VerifyClient, VerifyError
from wire.protocol import Hello, Welcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkState:
    connected: bool
    detail: str  # what happened, for a person to read
    retry_in_s: float | None = None  # when the next reconnect attempt is due, if one is


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.25  # quick enough to catch a service restarting in place
    factor: float = 2.0
    max_s: float = 15.0
    jitter: float = 0.2  # +-20%, so many clients of one restarted service do not stampede

    def delays(self):
        delay = self.first_s
        while True:
            yield delay * random.uniform(1 - self.jitter, 1 + self.jitter)
            delay = min(delay * self.factor, self.max_s)


OnState = Callable[[LinkState], None]

# How long a reply waits for a lost service before it goes on offline: another replica behind a
# load balancer usually takes the session over within it (benchmarks/soak.py on a loaded 2-core
# machine: p50 0.7 s, p90 1.7 s, p99 4 s), and every token it verifies is the target's, where an
# offline one may not be.
TAKEOVER_WAIT_S = 3.0


class ServiceLink:
    def __init__(self, url: str, hello: Hello, token: str | None = None, ca_file: str | None = None,
                 on_state: OnState | None = None, backoff: Backoff = Backoff(),
                 stall_timeout_s: float = 10.0, prove_service: bool = False, takeover_wait_s: float = 0.0):
        self.url = url
        self.on_state = on_state
        # how long a reply that lost the service waits for a new session before its first offline
        # token (the loop waits; the link says so when it is lost). 0: offline at once.
        self.takeover_wait_s = takeover_wait_s
        # A handshake that hangs is a stall too: one timeout for both. prove_service: every
        # connection, reconnects too, first checks the service holds the token (VerifyClient)
        self._connect_args = dict(url=url, hello=hello, token=token, ca_file=ca_file,
                                  open_timeout_s=stall_timeout_s, stall_timeout_s=stall_timeout_s,
                                  prove_service=prove_service)
        self._backoff = backoff
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._wake = threading.Event()  # cuts a backoff wait short
        self._reconnector: threading.Thread | None = None
        self._client: VerifyClient | None = VerifyClient(**self._connect_args)
        self.welcome: Welcome = self._client.welcome  # the latest handshake's answer: the service's limits
        self.connections = 1  # how many sessions this link has opened, reconnects included

    @property
    def connected(self) -> bool:
        return self._client is not None

    def current(self) -> VerifyClient | None:
        """The live client, or None while the service is down."""
        client = self._client
        if client is not None and client.closed:
            self._replace_closed(client)
        return self._client

    def _replace_closed(self, client: VerifyClient) -> None:
        """The service closed the connection between rounds (an idle session, a drain): connect
        again at once, so that the next round is verified, and fall back to reconnecting in the
        background if that fails."""
        try:
            fresh = VerifyClient(**self._connect_args)
        except (ServiceUnreachable, VerifyError) as exc:
            self.lost(f"the service closed the session and did not take a new one: {exc}")
            return
        with self._lock:
            if self._client is not client or self._closed.is_set():
                fresh.close()
                return
            self._client, self.welcome = fresh, fresh.welcome
            self.connections += 1
        client.close()
        log.info("the service closed the session (%s); opened a new one", client.close_reason or "no reason")
        self._notify(LinkState(True, f"reconnected to {self.url}"))

    def lost(self, reason: str) -> None:
        """The service stopped answering: drop the client and reconnect in the background."""
        with self._lock:
            client, self._client = self._client, None
            if self._reconnector is None or not self._reconnector.is_alive():
                # closing a stalled connection waits out its close handshake: not on this thread
                self._reconnector = threading.Thread(target=self._reconnect, args=(client,),
                                                     name="specwire-reconnect", daemon=True)
                self._reconnector.start()
            elif client is not None:
                threading.Thread(target=client.close, daemon=True).start()
        then = self.after_loss()
        log.warning("lost the verification service at %s (%s); %s", self.url, reason, then)
        self._notify(LinkState(False, f"lost the service ({reason}); {then}"))

    def after_loss(self) -> str:
        """What a reply does once the service is lost, in words."""
        if self.takeover_wait_s > 0:
            return f"reconnecting, continuing offline if no service takes over within {self.takeover_wait_s:g} s"
        return "continuing offline"

    def wait_connected(self, within_s: float) -> bool:
        """Whether the link has a connection within `within_s` (polled: it reconnects on its own thread)."""
        deadline = time.monotonic() + within_s
        while self.current() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def retry_now(self) -> None:
        """Try to reconnect at once instead of at the next backoff step (the service is known to be back)."""
        self._wake.set()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _reconnect(self, old: VerifyClient | None) -> None:
        if old is not None:  # a stalled connection's close waits out its handshake (2 s): not before the reconnect
            threading.Thread(target=old.close, name="specwire-close", daemon=True).start()
        for delay in self._backoff.delays():
            self._notify(LinkState(False, f"service unreachable, retrying in {delay:.1f} s", delay))
            self._wake.wait(delay)  # or sooner, on retry_now() or close()
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                client = VerifyClient(**self._connect_args)
            except ServiceBusy as exc:  # full or draining: wait at least as long as it asks
                if exc.retry_after_s and exc.retry_after_s > delay and self._closed.wait(exc.retry_after_s - delay):
                    return
                continue
            except ServiceUnreachable:
                continue
            except VerifyError as exc:  # refused for good (token, vocabulary): stop trying
                self._notify(LinkState(False, f"the service refused to reconnect: {exc}"))
                return
            with self._lock:
                if self._closed.is_set():
                    client.close()
                    return
                self._client, self.welcome = client, client.welcome
                self.connections += 1
            log.info("reconnected to the verification service at %s", self.url)
            self._notify(LinkState(True, f"reconnected to {self.url}"))
            return

    def _notify(self, state: LinkState) -> None:
        if self.on_state is not None:
            try:
                self.on_state(state)
            except Exception:  # a listener's bug must not stop the reconnects
                log.exception("link state listener failed")
