"""The chat's engine: drafter, service link and saved conversation, with no user interface.

Its work blocks (loading models, starting the service, connecting, generating), so the app
calls it from one thread worker at a time; it reports through an EngineListener, whose
methods are called from that worker or from the link's and the service's own threads.

A reply: the conversation is rendered with the draft GGUF's chat template and tokenized
(the oldest turns are left out when it no longer fits the context), the Speculator
generates, and every committed round is saved and reported as it comes. The tokens of
the previous turns are kept as they were generated, and only the text the template adds
after them is tokenized, so the drafter's and the service's caches stay valid from one
turn to the next.
"""

from __future__ import annotations

import argparse
import codecs
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from app.chat.conversation import LETTER, Conversation
from app.chat.embedded_service import EmbeddedService, EmbeddedServiceError
from app.chat.settings import ChatSettings
from app.chat.store import ChatLog, ChatStore, Committed, Note, ReplyEnded, SystemPrompt, UserMessage, now_iso
from app.commands import UserError, resolve_model
from local_draft.chat_template import ChatTemplate, Message, template_for
from local_draft.draft_model import DraftModel, DraftModelError
from local_draft.service_link import LinkState, ServiceLink
from local_draft.speculator import Speculator
from local_draft.verify_client import ServiceUnreachable, VerifyError
from remote_verify.protocol import Hello, SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveStats:
    """The figures of the status line, copied out of the running generation."""

    mode: str  # "hybrid", "remote" or "offline"
    k: int | None  # the setting: None is auto
    last_k: int  # what the latest round drafted
    rounds: int = 0
    generated: int = 0
    offline: int = 0  # tokens (and rounds: one each) made while the service was away
    drafted: int = 0
    acceptance_rate: float = 0.0
    tokens_per_round: float = 0.0
    tokens_per_s: float = 0.0
    round_trip_s: float = 0.0

    @property
    def verified_rounds(self) -> int:
        return self.rounds - self.offline


@dataclass(frozen=True)
class Connection:
    connected: bool
    detail: str  # for a person: where, or what went wrong
    retry_in_s: float | None = None


class EngineListener(Protocol):
    def progress(self, text: str, from_service: bool = False) -> None:
        """A startup step, or (from_service) a line the starting service logged."""

    def committed(self, turn: int, provenance: list[str], pieces: list[str], stats: LiveStats) -> None:
        """A round's tokens, as text pieces with their provenance."""

    def connection_changed(self, connection: Connection) -> None:
        """The link to the service went up or down."""

    def note(self, turn: int | None, text: str) -> None:
        """Something to tell the user: about a reply (turn) or about the chat (None)."""


class StartupProblem(Exception):
    """The chat cannot reach its service; `offline_possible` says whether the drafter alone can go on."""

    def __init__(self, kind: str, message: str, offline_possible: bool = True, retry_possible: bool = True):
        super().__init__(message)
        self.kind = kind  # "missing_model", "service_failed", "unreachable", "refused"
        self.offline_possible = offline_possible
        self.retry_possible = retry_possible


class BusyError(RuntimeError):
    """An operation that has to wait for the reply in progress."""


@dataclass(frozen=True)
class ReplyOutcome:
    turn: int
    stop_reason: str
    stats: dict


class ChatEngine:
    def __init__(self, settings: ChatSettings, listener: EngineListener):
        self.settings = settings
        self.listener = listener
        self.params = settings.params
        self.k = settings.k
        self.store = ChatStore(settings.chats_dir)
        self.conversation = Conversation.load(settings.resume) if settings.resume else Conversation()
        self.chat: ChatLog | None = self.store.reopen(self.conversation.chat_id) if settings.resume else None
        self.draft: DraftModel | None = None
        self.template: ChatTemplate | None = None
        self.speculator: Speculator | None = None
        self.service: EmbeddedService | None = None
        self.link: ServiceLink | None = None
        self.service_url: str | None = None
        self.service_context: int | None = None  # the service's max_context, once connected
        self.max_draft = 32
        self.connection = Connection(False, "offline" if settings.offline else "not connected yet")
        self.current_turn: int | None = None  # the turn being generated
        self.dropped_turns = 0  # oldest turns left out of the last prompt
        self._known_text = ""  # the text whose tokens are _known_tokens (the last prompt and its reply)
        self._known_tokens: list[int] = []
        self._end_ids: frozenset[int] = frozenset()  # the drafter's end-of-generation tokens
        self._lock = threading.RLock()  # one blocking operation at a time

    # ---- state ----------------------------------------------------------------------

    @property
    def mode(self) -> str:
        if self.link is None:
            return "offline"
        return "remote" if self.k == 0 else "hybrid"

    @property
    def busy(self) -> bool:
        return self.current_turn is not None

    @property
    def context_limit(self) -> int:
        limit = self.settings.context
        return min(limit, self.service_context) if self.service_context and self.link is not None else limit

    def live_stats(self) -> LiveStats:
        s = self.speculator.stats if self.speculator is not None else None
        if s is None:
            return LiveStats(self.mode, self.k, 0)
        return LiveStats(self.mode, self.k, s.last_k, s.rounds, s.generated, s.offline, s.drafted,
                         s.acceptance_rate, s.tokens_per_round, s.tokens_per_s, s.last_round_trip_s)

    # ---- starting -------------------------------------------------------------------

    def start(self) -> None:
        """Load the drafter, and reach the service unless offline. Raises StartupProblem."""
        with self._lock:
            problem = None
            if self.settings.embedded and not self.settings.offline:
                try:
                    self._launch_embedded()  # the child loads its target while we load the drafter
                except StartupProblem as exc:
                    problem = exc  # told after the drafter is loaded, so that offline stays possible
            self.listener.progress(f"loading the draft model {self.settings.draft.name}")
            try:
                self.draft = DraftModel(self.settings.draft, n_ctx=self.settings.context,
                                        gpu_layers=self.settings.draft_gpu_layers)
            except DraftModelError as exc:
                raise StartupProblem("missing_model", str(exc), offline_possible=False, retry_possible=False) from exc
            bos = self.draft.token_text(self.draft.bos_id).decode("utf-8", "replace")
            eos = self.draft.token_text(self.draft.eos_id).decode("utf-8", "replace")
            self.template = template_for(self.draft.chat_template, bos, eos)
            if self.template.is_fallback:
                self.listener.note(None, f"{self.settings.draft.name} carries no usable chat template: using ChatML")
            self._end_ids = self.draft.end_ids  # a scan of the vocabulary: now, not in the first reply
            self.speculator = Speculator(self.draft, None, self.params, k=self.k, seed=self.settings.seed,
                                         pipeline=True)  # drafts the next block while a verdict is in flight
            if self.settings.system is not None and self.settings.system != self.conversation.system:
                self._set_system(self.settings.system)
            if problem is not None:
                raise problem
            if not self.settings.offline:
                self._connect()

    def connect(self) -> None:
        """Go online: start the embedded service if needed and connect. Raises StartupProblem."""
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            if self.settings.embedded and (self.service is None or not self.service.running):
                self._launch_embedded()
            self._connect()

    def _launch_embedded(self) -> None:
        """Start the embedded service's child process (without waiting for it)."""
        if self.service is not None and self.service.running:
            return
        try:
            target = resolve_model(argparse.Namespace(target=self.settings.target, pair=self.settings.pair), "target")
        except UserError as exc:
            raise StartupProblem("missing_model", str(exc), retry_possible=False) from exc
        self.service = EmbeddedService(target, self.settings.backend, restart=self.settings.restart_service,
                                       on_output=lambda line: self.listener.progress(line, True),
                                       on_event=self._on_service_event)
        self.listener.progress(f"starting the verification service for {Path(target).name}")
        self.service.launch()

    def _connect(self) -> None:
        if self.settings.embedded:
            if not self.service.running:
                self.listener.progress(f"waiting for the verification service ({Path(self.service.target).name})")
            try:
                self.service_url = self.service.wait_ready()
            except EmbeddedServiceError as exc:
                raise StartupProblem("service_failed", str(exc)) from exc
        else:
            self.service_url = self.settings.server
        self._open_link()

    def _open_link(self) -> None:
        self._close_link()
        self.listener.progress(f"connecting to {self.service_url}")
        hello = Hello(vocab_fingerprint=self.draft.vocab_fingerprint, vocab_size=self.draft.vocab_size,
                      bos_id=self.draft.bos_id, eos_id=self.draft.eos_id, sampling=self.params,
                      seed=self.settings.seed, client="specwire chat")
        try:
            link = ServiceLink(self.service_url, hello, token=self.settings.token, ca_file=self.settings.ca_file,
                               on_state=self._on_link_state)
        except ServiceUnreachable as exc:
            raise StartupProblem("unreachable", str(exc)) from exc
        except VerifyError as exc:
            what = "refused the token" if exc.code == "http_401" else "refused this chat"
            raise StartupProblem("refused", f"the verification service {what}: {exc}", retry_possible=False) from exc
        welcome = link.current().welcome
        self.link = link
        self.speculator.link = link
        self.service_context = welcome.max_context
        self.max_draft = welcome.max_draft
        if self.k is not None and self.k > self.max_draft:
            self.listener.note(None, f"k = {self.k} is more than this service verifies a round: k = {self.max_draft}")
            self.set_k(self.max_draft)
        self._set_connection(Connection(True, self._where()))

    def _where(self) -> str:
        return "embedded service" if self.settings.embedded else self.service_url

    # ---- changing settings between replies ------------------------------------------

    def go_offline(self) -> None:
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            self._close_link()
            self._set_connection(Connection(False, "offline by choice"))

    def set_k(self, k: int | None) -> None:
        if k is not None and not 0 <= k <= self.max_draft:
            raise ValueError(f"k must be auto or 0 to {self.max_draft} (the service's longest draft), got {k}")
        self.k = k
        if self.speculator is not None:
            self.speculator.k = k  # read at the start of each round

    def set_params(self, params: SamplingParams) -> None:
        """New sampling parameters; the service learns them in a new session (they travel in Hello)."""
        problems = params.problems()
        if problems:
            raise ValueError("; ".join(problems))
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            self.params = params
            self.speculator.params = params
            if self.link is not None:
                try:
                    self._open_link()
                except StartupProblem as exc:
                    self._set_connection(Connection(False, "offline"))
                    self.listener.note(None, f"could not reconnect with the new settings: {exc}; "
                                             "offline now (/online tries again)")

    def set_system(self, text: str) -> None:
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            self._set_system(text)

    def _set_system(self, text: str) -> None:
        event = SystemPrompt(text)
        if self.chat is not None:
            self.chat.write(event, durable=True)
        self.conversation.apply(event)

    def new_chat(self) -> None:
        """Forget the conversation on screen and start a new saved chat (the old one stays)."""
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            if self.chat is not None:
                self.chat.close()
            self.chat = None
            self.conversation = Conversation(system=self.conversation.system)
            self.dropped_turns = 0

    # ---- replying -------------------------------------------------------------------

    def check_prompt(self, text: str) -> None:
        """Raise ValueError when `text` cannot be sent (too long for the context)."""
        self.conversation.fit(text, self._count_tokens, self._prompt_budget())

    def reply(self, text: str, should_stop: Callable[[], bool]) -> ReplyOutcome:
        """Save the user's message, generate the reply, save it as it comes. ValueError if it cannot fit."""
        with self._lock:
            messages, dropped = self.conversation.fit(text, self._count_tokens, self._prompt_budget())
            prompt_text = self.template.render(messages)
            prompt = self._prompt_tokens(prompt_text)
            turn = self.conversation.next_turn
            self._write(UserMessage(turn, text, now_iso()), durable=True)
            self.current_turn = turn
            try:
                if dropped > self.dropped_turns:
                    self.note(turn, f"the oldest {dropped} turn{'s' if dropped > 1 else ''} no longer fit the "
                                    f"model's context of {self.context_limit:,} tokens: left out of what it sees "
                                    "(the saved chat keeps them)")
                self.dropped_turns = dropped
                return self._generate(turn, prompt_text, prompt, should_stop)
            finally:
                self.current_turn = None

    def _generate(self, turn: int, prompt_text: str, prompt: list[int], should_stop) -> ReplyOutcome:
        draft, end_ids = self.draft, self._end_ids
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        kept: list[int] = []  # the reply's tokens up to an end token
        ended = False

        def on_commit(tokens: list[int], provenance: list[str]) -> None:
            nonlocal ended
            if ended:
                return
            for i, token in enumerate(tokens):
                if token in end_ids:  # the reply ends here (the Speculator stops after this round)
                    tokens, provenance, ended = tokens[: i + 1], provenance[: i + 1], True
                    break
            pieces = [decoder.decode(draft.token_bytes(t)) for t in tokens]
            kept.extend(tokens)
            self._write(Committed(turn, list(tokens), "".join(LETTER[p] for p in provenance), pieces))
            self.listener.committed(turn, list(provenance), pieces, self.live_stats())

        max_new = max(1, min(self.settings.max_tokens, self.context_limit - len(prompt)))
        stop_reason, stats = "error", {}
        try:
            result = self.speculator.generate(prompt, max_new, on_commit, lambda: ended or should_stop())
            stop_reason = "eos" if ended else result.stop_reason
            stats = result.stats.as_dict()
        except VerifyError as exc:
            self.note(turn, f"the service refused a round ({exc}): the reply stops here")
            if exc.fatal and self.link is not None:
                self.link.lost(str(exc))
        except Exception as exc:  # a bug must not lose the conversation: end the turn, say so
            log.exception("reply %d failed", turn)
            self.note(turn, f"the reply failed: {exc!r} (details in the log file)")
        finally:
            counts = {name: 0 for name in LETTER}
            for p in self.conversation.reply_of(turn).provenance:
                counts[p] += 1
            stats.update(mode=self.mode, k="auto" if self.k is None else self.k,
                         temperature=self.params.temperature, prompt_tokens=len(prompt), **counts)
            self._write(ReplyEnded(turn, stop_reason, stats), durable=True)
        if stop_reason == "context":
            self.note(turn, f"the reply filled the model's context of {self.context_limit:,} tokens")
        reply_text = self.conversation.reply_of(turn).text
        body = [t for t in kept if t not in end_ids]
        self._known_text, self._known_tokens = prompt_text + reply_text, prompt + body
        return ReplyOutcome(turn, stop_reason, stats)

    def _prompt_budget(self) -> int:
        """Tokens the prompt may take: the context less room for a reply (at most half of it)."""
        limit = self.context_limit
        return limit - min(self.settings.max_tokens, limit // 2)

    def _count_tokens(self, messages: list[Message]) -> int:
        return len(self._prompt_tokens(self.template.render(messages)))

    def _prompt_tokens(self, text: str) -> list[int]:
        """Tokens of the rendered prompt, reusing the last turn's tokens where its text is a prefix."""
        if self._known_text and text.startswith(self._known_text):
            return self._known_tokens + self.draft.tokenize(text[len(self._known_text):], add_bos=False)
        bos_text = self.template.bos_token
        add_bos = self.draft.add_bos and not (bos_text and text.startswith(bos_text))
        return self.draft.tokenize(text, add_bos=add_bos)

    # ---- notes, events, saving ------------------------------------------------------

    def note(self, turn: int | None, text: str) -> None:
        """Tell the user; a note about a reply is saved with it."""
        if turn is not None:
            self._write(Note(turn, text))
        self.listener.note(turn, text)

    def _write(self, event, durable: bool = False) -> None:
        if self.chat is None:
            where = "offline" if self.link is None else (self.service_url or "")
            self.chat = self.store.create(self.settings.draft.name, where)
            self.conversation.chat_id = self.chat.id
            if self.conversation.system:
                self.chat.write(SystemPrompt(self.conversation.system))
        self.chat.write(event, durable)
        self.conversation.apply(event)

    def _on_link_state(self, state: LinkState) -> None:
        if state.retry_in_s is None:  # a change worth a note; retry countdowns only update the status
            if state.connected:
                text = f"{state.detail}: rounds are verified again"
            elif state.detail.startswith("lost the service"):  # its reason is in the log
                text = "lost the verification service: continuing offline, unverified tokens are marked"
            else:
                text = state.detail
            self.note(self.current_turn, text)
        self._set_connection(Connection(state.connected, self._where() if state.connected else state.detail,
                                        state.retry_in_s))

    def _on_service_event(self, text: str, running: bool) -> None:
        """The embedded service died or came back (on the service's watcher thread)."""
        self.note(self.current_turn, text)
        link = self.link
        if running and link is not None and not link.connected:
            link.retry_now()  # it is back: reconnect now, not at the next backoff step (up to 15 s away)

    def _set_connection(self, connection: Connection) -> None:
        self.connection = connection
        self.listener.connection_changed(connection)

    def _close_link(self) -> None:
        link, self.link = self.link, None
        if self.speculator is not None:
            self.speculator.link = None
        if link is not None:
            link.close()

    def close(self) -> None:
        """Close the link, stop the embedded service, and flush the saved chat.

        A reply asked to stop ends within a round and saves its end first; a start that
        waits for the service is released by stopping the service.
        """
        held = self._lock.acquire(timeout=5)
        if not held and self.service is not None:
            self.service.stop()
            held = self._lock.acquire(timeout=10)
        try:
            self._close_link()
            if self.service is not None:
                self.service.stop()
            if self.chat is not None:
                self.chat.close()
        finally:
            if held:
                self._lock.release()
