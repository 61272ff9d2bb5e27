"""The endpoint's engine: tokenizer, drafters and service, shared by every request.

Its work blocks (loading models, starting the service, generating), so the HTTP side calls
`prepare` and `run` on a thread of the request's own. Each request gets its own session
with the service (a ServiceLink with its sampling settings in the Hello, opened ahead where
it can be: app/api/sessions.py, closed when it ends) and borrows a drafter
(app/api/drafters.py); app/api/generation.py generates it and reports its events.

The prompt is made as `specwire chat` makes it: messages rendered with the chat template of
the draft GGUF, tokenized with the drafter's vocabulary; a text prompt is tokenized as
`specwire generate` tokenizes one.
"""

from __future__ import annotations

import logging
from typing import Callable

from app.api.drafters import DrafterPool
from app.api.errors import bad_request, service_error
from app.api.events import Emit, Job
from app.api.generation import RequestGeneration
from app.api.request_body import DEFAULT_TEMPERATURE, CompletionRequest
from app.api.sessions import WarmSessions
from app.api.settings import ApiSettings
from app.chat.reply import PromptTokens
from app.chat.service_connection import ServiceConnection
from app.chat.state import Connection, StartupProblem
from app.tokenizer_source import open_tokenizer
from app.user_error import UserError
from local_draft.chat_template import ChatTemplateError, Message, template_for
from local_draft.controller_memory import ControllerMemory
from local_draft.draft_model import DraftModel, DraftModelError
from local_draft.service_link import TAKEOVER_WAIT_S, LinkState, OnState, ServiceLink
from local_draft.verify_client import ServiceUnreachable, VerifyError
from wire import grammar as grammars
from wire.protocol import Grammar, SamplingParams

log = logging.getLogger(__name__)


class _Progress:
    """The service connection's listener: startup steps to the caller, the rest to the log."""

    def __init__(self, progress: Callable[[str], None]):
        self._progress = progress

    def progress(self, text: str, from_service: bool = False) -> None:
        if from_service:
            log.info("service: %s", text)
        else:
            self._progress(text)

    def reading(self, turn, prompt_tokens, unread_tokens) -> None:
        pass

    def committed(self, turn, provenance, pieces, stats) -> None:
        pass

    def connection_changed(self, connection: Connection) -> None:
        log.info("service: %s", connection.detail)

    def note(self, turn, text: str) -> None:
        log.warning("%s", text)


class ApiEngine:
    def __init__(self, settings: ApiSettings, progress: Callable[[str], None] = log.info):
        self.settings = settings
        self.models = settings.models
        self._listener = _Progress(progress)
        self.connection = ServiceConnection(self.models, lambda: self._listener,
                                            lambda text: self._listener.note(None, text))
        self.tokenizer: DraftModel | None = None
        self.template = None
        self.pool = DrafterPool([])
        self.url: str | None = None  # the service's, once found; None: offline
        self.target_name = ""
        self.max_context: int | None = None
        self.end_ids: frozenset[int] = frozenset()
        self.sessions = WarmSessions(self._new_link)

    # ---- starting -------------------------------------------------------------------

    def start(self) -> None:
        """Load the tokenizer and the drafters, and find the service (started here if embedded).
        Raises UserError when it cannot serve at all."""
        models = self.models
        if models.embedded and not models.offline:
            try:
                self.connection.launch_embedded()  # the child loads its target while the drafters load
            except StartupProblem as exc:
                raise UserError(f"{exc} (or run with --offline: the drafter alone, unverified)") from exc
        no_model = models.drafting == "ngram"
        self._listener.progress(f"loading the {'tokenizer of' if no_model else 'draft model'} {models.draft.name}")
        try:
            self.tokenizer = open_tokenizer(models.draft, n_ctx=models.context)
            drafters = [] if no_model else [
                DraftModel(models.draft, n_ctx=models.context, gpu_layers=models.draft_gpu_layers,
                           n_threads=models.draft_threads) for _ in range(self.settings.drafters)]
        except DraftModelError as exc:
            raise UserError(str(exc)) from exc
        self.pool = DrafterPool(drafters)
        tokenizer = self.tokenizer
        bos = tokenizer.token_text(tokenizer.bos_id).decode("utf-8", "replace")
        eos = tokenizer.token_text(tokenizer.eos_id).decode("utf-8", "replace")
        self.template = template_for(tokenizer.chat_template, bos, eos)
        if self.template.is_fallback:
            log.warning("%s carries no usable chat template: using ChatML", models.draft.name)
        self.end_ids = tokenizer.end_ids
        if not models.offline:
            self._find_service()
        if self.url is not None:
            self.sessions.prepare_for(SamplingParams(temperature=DEFAULT_TEMPERATURE))  # what a bare request asks

    def _find_service(self) -> None:
        """Connect once: a refused token or vocabulary is an error now, not in every request."""
        try:
            link = self.connection.open(self.tokenizer.hello(SamplingParams(), client="specwire api"))
        except StartupProblem as exc:
            if exc.kind == "unreachable" and not self.models.embedded and self.pool.size:
                log.warning("%s: serving offline (unverified) until it can be reached", exc)
                self.url = self.models.server  # each request tries it again
                return
            offline = " (or run with --offline: the drafter alone, unverified)" if self.pool.size else ""
            raise UserError(f"{exc}{offline}") from exc
        self.url, self.max_context = self.connection.url, link.welcome.max_context
        self.target_name = link.welcome.target
        self.connection.close_link()  # each request opens a session of its own

    @property
    def context_limit(self) -> int:
        limit = self.models.context
        return min(limit, self.max_context) if self.max_context else limit

    @property
    def draft_name(self) -> str:
        return "ngram" if self.models.drafting == "ngram" else self.models.draft.name

    # ---- requests -------------------------------------------------------------------

    def prepare(self, request: CompletionRequest, received_at: float = 0.0) -> Job:
        """The request's prompt as tokens, and its token budget; ApiError (400) when it cannot fit."""
        if request.kind == "chat":
            try:
                text = self._render(request)
            except ChatTemplateError as exc:
                raise bad_request(str(exc), "messages") from exc
            prompt = PromptTokens(self.tokenizer, self.template).of(text)  # the chat's rule for BOS
        elif isinstance(request.prompt, str):
            prompt = self.tokenizer.tokenize(request.prompt)  # as `specwire generate` does
        else:
            prompt = list(request.prompt)
            vocab = self.tokenizer.vocab_size
            if not all(0 <= token < vocab for token in prompt):
                raise bad_request(f"`prompt` holds token ids outside the vocabulary (0 to {vocab - 1})", "prompt")
        if request.grammar is not None:
            self._check_grammar(request.grammar)
        limit = self.context_limit
        if len(prompt) >= limit:
            raise bad_request(f"This model's context is {limit:,} tokens, and the prompt alone takes "
                              f"{len(prompt):,}: shorten it (the reply needs room too).",
                              "messages" if request.kind == "chat" else "prompt", "context_length_exceeded")
        room = limit - len(prompt)
        return Job(request, prompt, min(request.max_tokens or room, room), received_at)

    def _render(self, request: CompletionRequest) -> str:
        """The chat's prompt text, with the request's tools shown to the model (app/api/tool_calls.py)."""
        messages, tools = list(request.messages), request.tools
        if tools is None:
            return self.template.render(messages)
        if self.template.takes_tools:
            return self.template.render(messages, tools=list(tools.functions))
        if messages and messages[0].role == "system":  # the tools follow the request's own system text
            first = messages[0]
            messages[0] = Message("system", first.content + "\n\n" + tools.system_text())
        else:
            messages.insert(0, Message("system", tools.system_text()))
        return self.template.render(messages)

    def _check_grammar(self, grammar: Grammar) -> None:
        """A 400 now for a schema the grammar compiler refuses, not an error from the service later."""
        tokenizer = self.tokenizer
        try:
            vocab = grammars.vocab_for(tokenizer.vocab_fingerprint, n_vocab=tokenizer.vocab_size,
                                       load=lambda: [tokenizer.token_text(i) for i in range(tokenizer.vocab_size)])
            grammars.TokenConstraint(grammar, vocab, self.end_ids)
        except grammars.GrammarError as exc:
            raise bad_request(f"`response_format`: {exc}", "response_format") from exc

    def run(self, job: Job, emit: Emit, should_stop: Callable[[], bool]) -> None:
        """Generate one request on this thread, reporting its events; ends early when `should_stop`."""
        RequestGeneration(self, job, emit, should_stop).run()

    def open_link(self, request: CompletionRequest, notes: list[str]) -> ServiceLink | None:
        """This request's own session with the service; None when there is no service to verify."""
        if self.url is None:
            return None

        def on_state(state: LinkState) -> None:
            if state.retry_in_s is None:  # a change, not a countdown
                notes.append(state.detail)
                log.warning("a request's service link: %s", state.detail)

        try:
            link, how = self.sessions.take(request.params, request.seed, on_state)
        except ServiceUnreachable as exc:
            if not self.pool.size:
                raise service_error(f"{exc}; with no draft model (--draft ngram) there is no offline mode") from exc
            notes.append(f"the verification service is unreachable ({exc}): generated offline, unverified")
            log.warning("%s", notes[-1])
            return None
        except VerifyError as exc:
            raise service_error(f"the verification service refused the session: {exc}") from exc
        notes.append(how)
        return link

    def _new_link(self, params: SamplingParams, seed: int | None, on_state: OnState | None) -> ServiceLink:
        hello = self.tokenizer.hello(params, seed=seed, client="specwire api")
        # the embedded service has a token of its own (app/chat/embedded_service.py); a --server, --token-file's
        embedded = self.models.embedded and self.connection.service is not None
        token = self.connection.service.token if embedded else self.models.token
        # a --server's reply waits a moment for another replica to take its session over; the embedded
        # service has none (it restarts, reloading its model): offline at once
        return ServiceLink(self.url, hello, token=token, ca_file=self.models.ca_file, on_state=on_state,
                           takeover_wait_s=0.0 if embedded else TAKEOVER_WAIT_S)

    def adaptive_memory(self, link: ServiceLink | None, drafter: DraftModel | None) -> ControllerMemory | None:
        """Adaptive k starts from the state saved for this service and drafter, as chat and generate do."""
        if link is None or self.models.k is not None:
            return None
        return ControllerMemory(self.url, drafter.path.name if drafter is not None else "ngram", link.welcome.target,
                                mode="hybrid")

    # ---- stopping -------------------------------------------------------------------

    def close(self) -> None:
        self.sessions.close()
        self.connection.close()
