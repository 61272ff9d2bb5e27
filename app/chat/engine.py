"""The chat's engine: drafter, service connection and saved conversation, with no user interface.

Its work blocks (loading models, starting the service, connecting, generating), so the app
calls it from one thread worker at a time; it reports through an EngineListener, whose
methods are called from that worker or from the link's and the service's own threads.

A reply: the conversation is rendered with the draft GGUF's chat template and tokenized
(the oldest turns are left out when it no longer fits the context; app/chat/reply.py), the
StreamSpeculator generates (the service streams, the drafter guesses ahead while that pays),
and every committed pass is saved and reported as it comes. The
connection to the service is app/chat/service_connection.py.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from app.chat.conversation import LETTER, Conversation
from app.chat.reply import PromptTokens, ReplyRounds
from app.chat.service_connection import ServiceConnection
from app.chat.settings import ChatSettings
from app.chat.state import BusyError, Connection, EngineListener, LiveStats, ReplyOutcome, StartupProblem
from app.chat.store import (
    ChatLog, ChatStore, Committed, Note, ReplyEnded, SystemPrompt, UserMessage, Withdrawn, now_iso,
)
from app.tokenizer_source import open_tokenizer
from local_draft.chat_template import ChatTemplate, template_for
from local_draft.draft_model import DraftModel, DraftModelError
from local_draft.controller_memory import ControllerMemory
from local_draft.generation_stats import GenerationStats
from local_draft.speculator import Speculator
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import ServiceUnreachable, VerifyError
from wire.protocol import SamplingParams

log = logging.getLogger(__name__)

NO_MODEL_RESUME_S = 30.0  # with no draft model (--draft ngram), how long a reply waits for a lost service


class ChatEngine:
    def __init__(self, settings: ChatSettings, listener: EngineListener | None = None):
        self.settings = settings
        self.listener = listener  # set by the screen that shows this engine, before it starts
        self.params = settings.params
        self.store = ChatStore(settings.chats_dir)
        self.conversation = Conversation.load(settings.resume) if settings.resume else Conversation()
        self.chat: ChatLog | None = self.store.reopen(self.conversation.chat_id) if settings.resume else None
        self.draft: DraftModel | None = None
        self.template: ChatTemplate | None = None
        self.speculator: StreamSpeculator | Speculator | None = None  # owns k from start() on
        self._memory: ControllerMemory | None = None  # where adaptive k's state is kept, once connected
        self.prompts: PromptTokens | None = None
        self.connection_to = ServiceConnection(settings, lambda: self.listener,
                                               lambda text: self.note(self.current_turn, text))
        self.current_turn: int | None = None  # the turn being generated
        self.dropped_turns = 0  # oldest turns left out of the last prompt
        self._end_ids: frozenset[int] = frozenset()  # the drafter's end-of-generation tokens
        self._lock = threading.RLock()  # one blocking operation at a time
        self._reply_started = 0.0

    # ---- state ----------------------------------------------------------------------

    @property
    def k(self) -> int | None:
        """The draft length setting (None: auto); the Speculator owns it once the drafter is loaded."""
        return self.speculator.k if self.speculator is not None else self.settings.k

    @property
    def link(self):
        return self.connection_to.link

    @property
    def service(self):
        return self.connection_to.service

    @property
    def connection(self) -> Connection:
        return self.connection_to.state

    @property
    def drafting(self) -> str:
        return self.settings.drafting

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
        limit, service = self.settings.context, self.connection_to.max_context
        return min(limit, service) if service and self.link is not None else limit

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
            if not self.settings.draft.is_file():  # before the target: without a drafter nothing runs
                raise StartupProblem("missing_model", f"there is no draft model at {self.settings.draft}",
                                     offline_possible=False, retry_possible=False)
            if self.settings.embedded and not self.settings.offline:
                try:
                    self.connection_to.launch_embedded()  # the child loads its target while we load the drafter
                except StartupProblem as exc:
                    problem = exc  # told after the drafter is loaded, so that offline stays possible
            no_model = self.drafting == "ngram"  # the GGUF's vocabulary alone, to tokenize
            self.listener.progress(f"loading the {'tokenizer of' if no_model else 'draft model'} "
                                   f"{self.settings.draft.name}")
            try:
                if no_model:
                    self.draft = open_tokenizer(self.settings.draft, n_ctx=self.settings.context)
                else:
                    self.draft = DraftModel(self.settings.draft, n_ctx=self.settings.context,
                                            gpu_layers=self.settings.draft_gpu_layers,
                                            n_threads=self.settings.draft_threads)
            except DraftModelError as exc:
                raise StartupProblem("missing_model", str(exc), offline_possible=False, retry_possible=False) from exc
            bos = self.draft.token_text(self.draft.bos_id).decode("utf-8", "replace")
            eos = self.draft.token_text(self.draft.eos_id).decode("utf-8", "replace")
            self.template = template_for(self.draft.chat_template, bos, eos)
            if self.template.is_fallback:
                self.listener.note(None, f"{self.settings.draft.name} carries no usable chat template: using ChatML")
            self.prompts = PromptTokens(self.draft, self.template)
            self._end_ids = self.draft.end_ids  # a scan of the vocabulary: now, not in the first reply
            self.speculator = self._generator()
            if self.settings.system is not None and self.settings.system != self.conversation.system:
                self._set_system(self.settings.system)
            if problem is not None:
                raise problem
            if not self.settings.offline:
                self._connect()

    def _generator(self) -> StreamSpeculator | Speculator:
        """The default mode (the service streams, the drafter guesses ahead while that pays), or rounds."""
        if self.settings.mode == "rounds":
            return Speculator(self.draft, None, self.params, k=self.settings.k, seed=self.settings.seed,
                              pipeline=True,  # drafts the next block while a verdict is in flight
                              drafting=self.drafting, end_ids=self._end_ids, resume_within_s=NO_MODEL_RESUME_S)
        return StreamSpeculator(self.draft, None, self.params, seed=self.settings.seed, max_block=self.settings.k,
                                drafting=self.drafting, end_ids=self._end_ids, resume_within_s=NO_MODEL_RESUME_S)

    def connect(self) -> None:
        """Go online: start the embedded service if needed and connect. Raises StartupProblem."""
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            self.connection_to.ensure_embedded()
            self._connect()

    def _connect(self) -> None:
        self._use_link(self.connection_to.open(self._hello()))

    def _reconnect(self) -> None:
        self._use_link(self.connection_to.reopen(self._hello()))

    def _hello(self):
        # a stream's seed (the user's, or one it made): its drafter guesses the service's draws with it
        seed = getattr(self.speculator, "seed", self.settings.seed)
        return self.draft.hello(self.params, seed=seed, client="specwire chat")

    def _use_link(self, link) -> None:
        self.speculator.link = link
        if self._memory is None:  # the first connection: adaptive k starts from the last chat's state
            drafter = "ngram" if self.drafting == "ngram" else self.draft.path.name
            self._memory = ControllerMemory(link.url, drafter, link.welcome.target, mode=self.settings.mode)
            self._memory.load_into(self.speculator.controller)
        max_draft = self.speculator.max_draft
        if self.k is not None and max_draft is not None and self.k > max_draft:
            self.listener.note(None, f"k = {self.k} is more than this service verifies a round: k = {max_draft}")
            self.speculator.set_k(max_draft)

    # ---- changing settings between replies ------------------------------------------

    def go_offline(self) -> None:
        if self.drafting == "ngram":
            raise ValueError("n-gram drafting (--draft ngram) has no local model: there is no offline mode")
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            self._close_link()
            self.connection_to.go_offline("offline by choice")

    def set_k(self, k: int | None) -> None:
        """A new draft length from the next round on; ValueError beyond the service's longest block."""
        max_draft = (self.speculator.max_draft if self.speculator is not None else None) or 32
        if k is not None and not 0 <= k <= max_draft:
            raise ValueError(f"k must be auto or 0 to {max_draft} (the service's longest draft), got {k}")
        if self.speculator is None:
            raise BusyError("the draft model is still loading")
        self.speculator.set_k(k)  # read at the start of each round

    def set_params(self, params: SamplingParams) -> None:
        """New sampling parameters (ValueError if invalid); the service learns them in a new session."""
        params.checked()
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            self.params = params
            self.speculator.params = params
            if self.link is not None:
                try:
                    self._reconnect()
                except StartupProblem as exc:
                    self._close_link()
                    self.connection_to.go_offline("offline")
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
            if self.speculator is not None:
                self.speculator.stats = GenerationStats()  # the status line's figures start again

    def open_chat(self, chat_id: str) -> None:
        """Continue another saved chat instead of this one (which stays saved). ChatInUse if another
        running chat holds it."""
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            if chat_id == self.conversation.chat_id:
                raise ValueError(f"chat {chat_id} is the one open here")
            chat = self.store.reopen(chat_id)
            if self.chat is not None:
                self.chat.close()
            self.chat = chat
            self.conversation = Conversation.load(chat.path)
            self.dropped_turns = 0
            if self.prompts is not None:
                self.prompts.forget()  # its tokens were this chat's
            if self.speculator is not None:
                self.speculator.stats = GenerationStats()

    def withdraw_last(self):
        """Take the last turn back (/retry, /edit): the saved chat records it, the model no longer sees it."""
        with self._lock:
            if self.busy:
                raise BusyError("a reply is in progress")
            if not self.conversation.turns:
                raise ValueError("there is no message to take back yet")
            turn = self.conversation.turns[-1]
            self._write(Withdrawn(turn.number), durable=True)
            return turn

    # ---- replying -------------------------------------------------------------------

    def check_prompt(self, text: str) -> None:
        """Raise ValueError when `text` cannot be sent (too long for the context)."""
        self.conversation.fit(text, self.prompts.count, self._prompt_budget())

    def reply(self, text: str, should_stop: Callable[[], bool]) -> ReplyOutcome:
        """Save the user's message, generate the reply, save it as it comes. ValueError if it cannot fit."""
        with self._lock:
            self._reply_started = time.perf_counter()  # the time to the first token counts from here
            messages, dropped = self.conversation.fit(text, self.prompts.count, self._prompt_budget())
            prompt_text = self.template.render(messages)
            prompt = self.prompts.of(prompt_text)
            turn = self.conversation.next_turn
            self._write(UserMessage(turn, text, now_iso()), durable=True)
            self.listener.reading(turn, len(prompt), self.prompts.unread(prompt))
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
        first_token_s = []

        def on_round(tokens: list[int], provenance: list[str], pieces: list[str]) -> None:
            if not first_token_s:
                first_token_s.append(round(time.perf_counter() - self._reply_started, 4))
            self._write(Committed(turn, tokens, "".join(LETTER[p] for p in provenance), pieces))
            self.listener.committed(turn, provenance, pieces, self.live_stats())

        rounds = ReplyRounds(self.draft, self._end_ids, on_round)
        max_new = max(1, min(self.settings.max_tokens, self.context_limit - len(prompt)))
        stop_reason, stats = "error", {}
        try:
            result = self.speculator.generate(prompt, max_new, rounds.commit, lambda: rounds.ended or should_stop())
            stop_reason = "eos" if rounds.ended else result.stop_reason
            stats = result.stats.as_dict()
            if self._memory is not None:  # the next chat starts where this reply left adaptive k
                self._memory.save(self.speculator.controller)
        except ServiceUnreachable as exc:  # only without a model: with one, the reply goes on offline
            self.note(turn, f"{exc}: the reply stops here (/retry once the service is back)")
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
            # as the user waits for it: with the prompt's making, not only the Speculator's part
            stats["first_token_s"] = first_token_s[0] if first_token_s else None
            stats.update(mode=self.mode, k="auto" if self.k is None else self.k,
                         temperature=self.params.temperature, prompt_tokens=len(prompt), **counts)
            self._write(ReplyEnded(turn, stop_reason, stats), durable=True)
        if stop_reason == "context":
            self.note(turn, f"the reply filled the model's context of {self.context_limit:,} tokens")
        self.prompts.remember(prompt_text + self.conversation.reply_of(turn).text, prompt + rounds.body)
        return ReplyOutcome(turn, stop_reason, stats)

    def _prompt_budget(self) -> int:
        """Tokens the prompt may take: the context less room for a reply (at most half of it)."""
        limit = self.context_limit
        return limit - min(self.settings.max_tokens, limit // 2)

    # ---- notes and saving -----------------------------------------------------------

    def note(self, turn: int | None, text: str) -> None:
        """Tell the user; a note about a reply is saved with it."""
        if turn is not None:
            self._write(Note(turn, text))
        self.listener.note(turn, text)

    def _write(self, event, durable: bool = False) -> None:
        if self.chat is None:
            where = "offline" if self.link is None else (self.connection_to.url or "")
            self.chat = self.store.create(self.settings.draft.name, where)
            self.conversation.chat_id = self.chat.id
            if self.conversation.system:
                self.chat.write(SystemPrompt(self.conversation.system))
        self.chat.write(event, durable)
        self.conversation.apply(event)

    def _close_link(self) -> None:
        if self.speculator is not None:
            self.speculator.link = None
        self.connection_to.close_link()

    def close(self) -> None:
        """Close the link, stop the embedded service, and flush the saved chat.

        A reply asked to stop ends within a round and saves its end first; a start that
        waits for the service is released by stopping the service.
        """
        held = self._lock.acquire(timeout=5)
        if not held:
            self.connection_to.stop_service()
            held = self._lock.acquire(timeout=10)
        try:
            self._close_link()
            self.connection_to.stop_service()
            if self.chat is not None:
                self.chat.close()
        finally:
            if held:
                self._lock.release()
