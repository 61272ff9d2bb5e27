"""One request's generation: borrow a drafter, open its session, generate, report, give back.

The request's events go out as they come: Delta (text safe to send), then Finished (with
the `specwire` provenance object) or Failed. The drafter and the session are given back
whatever happens; the drafter before the client hears the end, so that its next request
finds it free.

The service lost: a request with a drafter goes on offline by itself (the Speculator),
and verifies again if its session reconnects. One drafted by n-gram (no drafter was
free) waits for the service a while, then waits for a drafter and goes on the same way:
it loses nothing. Only with no draft model at all (--draft ngram) does it end with a 503.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

from app.api.drafters import DrafterPool
from app.api.errors import ApiError, bad_request, service_error
from app.api.events import Delta, Emit, Failed, Finished, Job
from app.api.logprobs import LogprobEntries
from app.api.tool_calls import CallWatch
from app.api.generator import HowToGenerate, build_generator
from app.api.reply_text import ReplyText
from app.api.request_body import CompletionRequest
from app.chat.settings import ChatSettings
from local_draft.controller_memory import ControllerMemory
from local_draft.draft_model import DraftModel
from local_draft.generation_stats import GenerationStats
from local_draft.stream_speculator import GrammarUnsupported
from local_draft.service_link import ServiceLink
from local_draft.verify_client import ServiceUnreachable, VerifyError

log = logging.getLogger(__name__)

FINISH_REASONS = {"eos": "stop", "max_tokens": "length", "context": "length", "stopped": "stop"}


def no_model_error(what: str) -> ApiError:
    return ApiError(503, f"{what}, and with no draft model (--draft ngram) there is nothing to generate with "
                         "offline", code="service_unavailable", kind="server_error")


class Engine(Protocol):
    """What a request's generation uses of the endpoint's engine (app/api/engine.py)."""

    models: ChatSettings
    tokenizer: DraftModel
    end_ids: frozenset[int]
    pool: DrafterPool

    def open_link(self, request: CompletionRequest, notes: list[str]) -> ServiceLink | None: ...

    def adaptive_memory(self, link: ServiceLink | None, drafter: DraftModel | None) -> ControllerMemory | None: ...


class RequestGeneration:
    def __init__(self, engine: Engine, job: Job, emit: Emit, should_stop: Callable[[], bool]):
        self.engine = engine
        self.job = job
        self.emit = emit
        self.should_stop = should_stop
        request = job.request
        self.how = HowToGenerate(request.params, request.seed, engine.models.k, engine.models.drafting,
                                 engine.end_ids, request.grammar, request.logprobs)
        self.text = ReplyText(engine.tokenizer.token_bytes, engine.end_ids, request.stops)
        self.notes: list[str] = []  # what happened to the request's session, for the provenance
        self.stats: list[GenerationStats] = []  # one per generator (two after an n-gram request's fallback)
        self.drafter = None
        self.link = None
        self.setup_s: float | None = None  # from the request's arrival to its generation's start
        self.entries = LogprobEntries(engine.tokenizer.token_bytes, engine.end_ids)
        self.logprobs: list[dict] | None = [] if request.logprobs >= 0 else None  # every entry so far
        self._unsent_logprobs: list[dict] = []  # the entries since the last Delta
        self._generator = None  # the generator running now (its token_logprobs)
        tools = request.tools
        self._watch = CallWatch() if tools is not None and tools.reads_calls and not tools.constrained else None

    def run(self) -> None:
        """Generate and report; every outcome is an event (none when the client went away)."""
        try:
            self.drafter = self.engine.pool.try_take()
            self.link = self.engine.open_link(self.job.request, self.notes)
            if self.link is None and self.drafter is None and not self._wait_for_drafter(
                    "the verification service is unreachable"):
                return
            mode, stop_reason = self._generate()
            if stop_reason is None:
                return  # the client is gone: nobody to tell
            tail = self.text.finish()
            content, calls = self.text.sent, []
            if self._reads_calls:
                content, calls = self.job.request.tools.read(self.text.sent)
                if self._holds_all:
                    tail = "" if calls else content or ""
                else:  # what was held back: the calls' text, or (no call after all) text like the rest
                    tail = self._watch.feed(tail)
                    tail = tail if calls else tail + self._watch.held
            if tail or self._unsent_logprobs:
                self.emit(Delta(tail, self._take_logprobs()))
            self.engine.pool.give_back(self.drafter)
            self.drafter = None
            reason = "stop" if self.text.stopped_at_string else FINISH_REASONS[stop_reason]
            reason = "tool_calls" if calls else reason
            unverified = self.text.count("offline")
            if unverified:
                log.warning("a reply of %d tokens holds %d unverified ones (made offline), marked as such",
                            len(self.text.token_ids), unverified)
            self.emit(Finished(self.text.sent, reason, len(self.job.prompt), len(self.text.token_ids),
                               self._provenance(mode), calls, content, self.logprobs))
        except ApiError as exc:
            self.emit(Failed(exc))
        except GrammarUnsupported as exc:
            field = "tool_choice" if self.job.request.tools is not None and self.job.request.tools.grammar() \
                == self.job.request.grammar else "response_format"
            self.emit(Failed(bad_request(f"`{field}` cannot be applied: {exc}", field, "unsupported_parameter")))
        except ServiceUnreachable as exc:
            self.emit(Failed(ApiError(503, f"{exc}: the reply stops here", code="service_unavailable",
                                      kind="server_error")))
        except VerifyError as exc:
            self.emit(Failed(service_error(f"the verification service refused the request: {exc}")))
        except Exception as exc:  # a bug must not hang the client: it hears a 500 in OpenAI's shape
            log.exception("a request failed")
            self.emit(Failed(ApiError(500, f"the request failed: {exc!r} (details in the log)",
                                      code="internal_error", kind="server_error")))
        finally:
            self.engine.pool.give_back(self.drafter)
            if self.link is not None:
                self.link.close()

    def _generate(self) -> tuple[str, str | None]:
        """(the last mode, the generation's stop reason); None when the client went away first."""
        mode = "offline" if self.link is None else ("hybrid" if self.drafter is not None else "ngram")
        while True:
            generator = self._generator = build_generator(mode, self.drafter, self.link, self.how)
            # adaptive k starts from the state saved for this service and drafter (a generator with one)
            controller = getattr(generator, "controller", None)
            memory = self.engine.adaptive_memory(self.link, self.drafter) if controller is not None else None
            if memory is not None:
                memory.load_into(controller)
            done = self.text.token_ids
            if self.setup_s is None:
                self.setup_s = time.perf_counter() - self.job.received_at
            try:
                result = generator.generate(self.job.prompt + done, self.job.max_tokens - len(done),
                                            self._on_commit, lambda: self.text.ended or self.should_stop())
            except ServiceUnreachable as exc:  # n-gram drafting, the service gone longer than it waits
                self.stats.append(generator.stats)
                if mode != "ngram":
                    raise
                self.notes.append(f"{exc}: going on with the draft model once one is free")
                if not self._wait_for_drafter(str(exc)):
                    return mode, None
                mode = "hybrid"  # offline now, verified again if the session reconnects
                continue
            self.stats.append(result.stats)
            if memory is not None:
                memory.save(controller)
            if self.should_stop() and not self.text.ended:
                return mode, None
            return mode, result.stop_reason

    def _wait_for_drafter(self, why: str) -> bool:
        """Wait for a free drafter (offline needs one); False if the client went away first."""
        self.drafter = self.engine.pool.take(self.should_stop)
        if self.drafter is None and not self.should_stop():
            raise no_model_error(why)
        return self.drafter is not None

    def _on_commit(self, tokens: list[int], provenance: list[str]) -> None:
        before = len(self.text.token_ids)
        piece = self.text.add(tokens, provenance)
        if self._watch is not None:  # tool_choice auto: what may be a call is held
            piece = self._watch.feed(piece)
        if self.logprobs is not None:  # the generator took this round's before telling: the last len(tokens)
            taken = len(self.text.token_ids) - before  # none after a stop
            given = self._generator.token_logprobs[-len(tokens):][:taken]
            entries = self.entries.of(tokens[:taken], given)
            self.logprobs += entries
            self._unsent_logprobs += entries
        if piece and not self._holds_all:
            self.emit(Delta(piece, self._take_logprobs()))

    def _take_logprobs(self) -> list[dict] | None:
        if self.logprobs is None:
            return None
        taken, self._unsent_logprobs = self._unsent_logprobs, []
        return taken

    @property
    def _reads_calls(self) -> bool:
        tools = self.job.request.tools
        return tools is not None and tools.reads_calls

    @property
    def _holds_all(self) -> bool:
        """A forced call: the reply is the call's JSON, read at its end; nothing of it goes out as text."""
        tools = self.job.request.tools
        return tools is not None and tools.constrained

    def _provenance(self, mode: str) -> dict:
        stats, text = self.stats, self.text
        unverified = text.count("offline")
        firsts = [s.first_token_s for s in stats if s.first_token_s is not None]
        wall = sum(s.wall_s for s in stats)
        return {
            "mode": mode,  # hybrid, ngram (every drafter was busy) or offline
            "verified": unverified == 0,
            "unverified_tokens": unverified,  # made by the drafter alone while no service verified them
            "drafted": sum(s.drafted for s in stats), "accepted": sum(s.accepted for s in stats),
            "target_passes": sum(s.verified_rounds for s in stats), "rounds": sum(s.rounds for s in stats),
            "provenance": text.provenance,  # [["draft" | "target" | "offline", count], ...] over token_ids
            "token_ids": text.token_ids,
            "setup_s": None if self.setup_s is None else round(self.setup_s, 4),  # prompt, drafter, session
            "first_token_s": round(firsts[0], 4) if firsts else None,  # then from the generation's start
            "tokens_per_s": round(sum(s.generated for s in stats) / wall, 2) if wall > 0 else 0.0,
            "notes": self.notes,
            "ignored": list(self.job.request.ignored),
        }
