"""The chat's connection to its verification service: start the embedded one, open, lose, close.

The embedded service is a child process started for the chat's target; a remote one is
a URL. Either way the connection is a ServiceLink that reconnects by itself; this object
starts and replaces it, and turns what happens to it into notes and status changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from app.chat.embedded_service import EmbeddedService, EmbeddedServiceError
from app.chat.settings import ChatSettings
from app.chat.state import Connection, EngineListener, StartupProblem
from app.threads_flags import colocated_serve_flags
from local_draft.service_link import TAKEOVER_WAIT_S, LinkState, ServiceLink
from local_draft.verify_client import ServiceUnreachable, VerifyError, cleartext_token_problem
from wire.protocol import Hello

Note = Callable[[str], None]  # tells the user, about the reply in progress if there is one


class ServiceConnection:
    def __init__(self, settings: ChatSettings, listener: Callable[[], EngineListener], note: Note):
        self.settings = settings
        self._listener = listener  # the engine's, read when needed: the screen sets it after building
        self._note = note
        self.service: EmbeddedService | None = None
        self.link: ServiceLink | None = None
        self.url: str | None = None
        self.max_context: int | None = None  # the service's, once connected
        self.state = Connection(False, "offline" if settings.offline else "not connected yet")

    def launch_embedded(self) -> None:
        """Start the embedded service's child process (without waiting for it)."""
        if self.service is not None and self.service.running:
            return
        target = self.settings.target
        if target is None:  # launch found no target file: the message says how to fetch it
            raise StartupProblem("missing_model", self.settings.target_problem or "no target model",
                                 retry_possible=False)
        listener = self._listener()
        self.service = EmbeddedService(target, self.settings.backend,
                                       thread_flags=colocated_serve_flags(self.settings.draft_threads),
                                       restart=self.settings.restart_service,
                                       on_output=lambda line: listener.progress(line, True),
                                       on_event=self._on_service_event)
        listener.progress(f"starting the verification service for {Path(target).name}")
        self.service.launch()

    def ensure_embedded(self) -> None:
        """Start the embedded service again if the chat uses one and it is not running."""
        if self.settings.embedded and (self.service is None or not self.service.running):
            self.launch_embedded()

    def open(self, hello: Hello) -> ServiceLink:
        """Wait for the service if it is embedded, then connect. Raises StartupProblem."""
        if self.settings.embedded:
            if not self.service.running:
                self._listener().progress(f"waiting for the verification service ({Path(self.service.target).name})")
            try:
                self.url = self.service.wait_ready()
            except EmbeddedServiceError as exc:
                raise StartupProblem("service_failed", str(exc)) from exc
        else:
            self.url = self.settings.server
        return self.reopen(hello)

    def reopen(self, hello: Hello) -> ServiceLink:
        """A new session on the service already found (new sampling settings travel in Hello)."""
        self.close_link()
        self._listener().progress(f"connecting to {self.url}")
        # the embedded service has a token of its own, and proves it holds it before the chat says a word
        embedded = self.settings.embedded and self.service is not None
        token = self.service.token if embedded else self.settings.token
        # a reply that loses a --server waits a moment for another replica to take its session over;
        # the embedded service has no other replica (it restarts, reloading its model): offline at once
        takeover_wait_s = 0.0 if embedded else TAKEOVER_WAIT_S
        try:
            link = ServiceLink(self.url, hello, token=token, ca_file=self.settings.ca_file,
                               on_state=self._on_link_state, prove_service=embedded, takeover_wait_s=takeover_wait_s)
        except ServiceUnreachable as exc:  # with no draft model (--draft ngram) there is no offline to offer
            raise StartupProblem("unreachable", str(exc), offline_possible=self.settings.drafting != "ngram") from exc
        except VerifyError as exc:
            what = "refused the token" if exc.code == "http_401" else "refused this chat"
            raise StartupProblem("refused", f"the verification service {what}: {exc}", retry_possible=False) from exc
        self.link = link
        exposed = cleartext_token_problem(self.url, token)
        if exposed:  # the log is a file while the chat runs: said in the transcript too
            self._note(f"warning: {exposed}")
        self.max_context = link.current().welcome.max_context
        self._set_state(Connection(True, self.where()))
        return link

    def where(self) -> str:
        return "embedded service" if self.settings.embedded else self.url

    def go_offline(self, why: str) -> None:
        self.close_link()
        self._set_state(Connection(False, why))

    def close_link(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.close()

    def close(self) -> None:
        self.close_link()
        self.stop_service()

    def stop_service(self) -> None:
        if self.service is not None:
            self.service.stop()

    def _on_link_state(self, state: LinkState) -> None:
        if state.retry_in_s is None:  # a change worth a note; retry countdowns only update the status
            if state.connected:
                text = f"{state.detail}: rounds are verified again"
            elif state.detail.startswith("lost the service") and self.settings.drafting == "ngram":
                text = ("lost the verification service: with no draft model (--draft ngram) a reply waits "
                        "for it to come back, and stops if it does not")
            elif state.detail.startswith("lost the service") and self.link is not None and self.link.takeover_wait_s:
                text = (f"lost the verification service: reconnecting, continuing offline if none takes over "
                        f"within {self.link.takeover_wait_s:g} s (unverified tokens are marked)")
            elif state.detail.startswith("lost the service"):  # its reason is in the log
                text = "lost the verification service: continuing offline, unverified tokens are marked"
            else:
                text = state.detail
            self._note(text)
        self._set_state(Connection(state.connected, self.where() if state.connected else state.detail,
                                   state.retry_in_s))

    def _on_service_event(self, text: str, running: bool) -> None:
        """The embedded service died or came back (on the service's watcher thread)."""
        self._note(text)
        link = self.link
        if running and link is not None and not link.connected:
            link.retry_now()  # it is back: reconnect now, not at the next backoff step (up to 15 s away)

    def _set_state(self, state: Connection) -> None:
        self.state = state
        self._listener().connection_changed(state)
