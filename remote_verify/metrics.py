"""The service's Prometheus metrics, served at `/metrics` on the WebSocket port.

Each service has its own registry, so several services in one process (the tests) keep
their counts apart. Acceptance per draft position is two counters, drafted and accepted,
labelled by position: their ratio is the acceptance rate at that position, and it sums
correctly across replicas.

Drafted and accepted tokens are also counted by where the client says its draft came
from (`Verify.draft_source`): "model" (a GGUF drafter), "ngram" (drafts looked up in the
context), "unstated" (a client that does not say, as every client before the field did),
and "other" for any name this service does not know, so no client can add label values.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Verify latency on a GPU is a few milliseconds; on a CPU with a large target, seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

KNOWN_DRAFT_SOURCES = ("model", "ngram")
UNSTATED_SOURCE = "unstated"  # draft_source "": an older client, or one that does not say
OTHER_SOURCE = "other"  # a name not in KNOWN_DRAFT_SOURCES
SOURCE_LABELS = KNOWN_DRAFT_SOURCES + (UNSTATED_SOURCE, OTHER_SOURCE)


def source_label(draft_source: str) -> str:
    """The metrics label for a Verify's draft_source: one of SOURCE_LABELS, whatever was sent."""
    if not draft_source:
        return UNSTATED_SOURCE
    return draft_source if draft_source in KNOWN_DRAFT_SOURCES else OTHER_SOURCE


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ready = Gauge("specwire_ready", "1 once the target is loaded and sessions are taken", registry=r)
        self.sessions = Gauge("specwire_sessions_open", "sessions open now", registry=r)
        self.sessions_total = Counter("specwire_sessions_opened", "sessions opened", registry=r)
        self.rounds = Counter("specwire_rounds", "verification rounds answered with a verdict", registry=r)
        self.drafted = Counter("specwire_drafted_tokens", "draft tokens received for verification", registry=r)
        self.accepted = Counter("specwire_accepted_tokens", "draft tokens accepted", registry=r)
        self.drafted_by_source = Counter("specwire_drafted_tokens_by_source", "draft tokens received, by the "
                                         "drafter the client names", ["source"], registry=r)
        self.accepted_by_source = Counter("specwire_accepted_tokens_by_source", "draft tokens accepted, by the "
                                          "drafter the client names", ["source"], registry=r)
        for label in SOURCE_LABELS:  # every series from the start, at 0: a rate() needs a first sample
            self.drafted_by_source.labels(label)
            self.accepted_by_source.labels(label)
        self.drafted_at = Counter("specwire_drafted_at_position", "rounds with a draft token at this position",
                                  ["position"], registry=r)
        self.accepted_at = Counter("specwire_accepted_at_position", "rounds accepting the draft token at this "
                                   "position", ["position"], registry=r)
        self.verify_seconds = Histogram("specwire_verify_seconds", "forward pass and acceptance of one round",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("specwire_queue_seconds", "time a request waited for the device",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("specwire_queue_depth", "requests waiting for the device", registry=r)
        self.target_passes = Gauge("specwire_target_passes", "forward passes run for rounds and streamed "
                                   "tokens (several sessions' may share one), since the start", registry=r)
        self.pass_members = Gauge("specwire_target_pass_members", "rounds and streamed tokens run in those "
                                  "passes: divided by the passes, the sessions a pass served on average",
                                  registry=r)
        self.plain_streams = Gauge("specwire_plain_streams", "streams a server-only service would run at once "
                                   "under the users now, as the last shared pass priced its plain pass (the "
                                   "fairness ledger's counterfactual: the pass's members, and more where users "
                                   "read between replies)", registry=r)
        self.micro_batches = Gauge("specwire_target_micro_batches", "llama.cpp micro-batches those passes ran "
                                   "in (each a graph run; 0 on other backends)", registry=r)
        self.padding_tokens = Gauge("specwire_target_padding_tokens", "tokens llama.cpp computed and threw away "
                                    "to run a shared pass as one micro-batch (0 on other backends)", registry=r)
        self.streamed = Counter("specwire_streamed_tokens", "tokens committed by streamed generation (the "
                                "target's own and the client's guesses it kept)", registry=r)
        self.stream_passes = Counter("specwire_stream_passes", "passes of streamed generation", registry=r)
        self.committed = Counter("specwire_committed_tokens", "tokens committed by rounds and streams: divided "
                                 "into the passes and the busy time, what speculation saves the device", registry=r)
        self.kv_slots = Gauge("specwire_kv_cache_slots", "sessions' KV cache slots allocated now (llama.cpp "
                              "pools; a pool keeps its size a while after sessions leave, so memory follows "
                              "this, not the sessions open; 0 on other backends)", registry=r)
        self.busy_seconds = Gauge("specwire_target_busy_seconds", "the device's time in forward passes, since "
                                  "the start", registry=r)
        self.vocab_downloads = Counter("specwire_vocab_downloads", "vocabulary files sent (GET /vocab.gguf)",
                                       registry=r)
        self.syncs = Counter("specwire_syncs", "histories rebuilt from a client's Sync", registry=r)
        self.errors = Counter("specwire_errors", "requests answered with an error, by code", ["code"], registry=r)
        self.refusals = Counter("specwire_refusals", "connections or sessions refused, by reason", ["reason"],
                                registry=r)

    def record_round(self, drafted: int, accepted: int, verify_s: float, queue_s: float) -> None:
        self.rounds.inc()
        self.committed.inc(accepted + 1)
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        for position in range(drafted):
            self.drafted_at.labels(str(position)).inc()
        for position in range(accepted):
            self.accepted_at.labels(str(position)).inc()
        self.verify_seconds.observe(verify_s)
        self.queue_seconds.observe(queue_s)

    def record_draft_source(self, draft_source: str, drafted: int, accepted: int) -> None:
        """A round's drafted and accepted tokens, under the label of the drafter its Verify names."""
        source = source_label(draft_source)
        self.drafted_by_source.labels(source).inc(drafted)
        self.accepted_by_source.labels(source).inc(accepted)

    def record_stream_pass(self, step, queue_s: float) -> None:
        """A pass of a stream (a session.StreamStep): its tokens, and the guesses it verified."""
        self.stream_passes.inc()
        self.streamed.inc(len(step.tokens))
        self.committed.inc(len(step.tokens))
        if step.drafted:
            self.drafted.inc(step.drafted)
            self.accepted.inc(step.accepted)
            self.record_draft_source(step.source, step.drafted, step.accepted)
            for position in range(step.drafted):
                self.drafted_at.labels(str(position)).inc()
            for position in range(step.accepted):
                self.accepted_at.labels(str(position)).inc()
        self.verify_seconds.observe(step.forward_s)
        self.queue_seconds.observe(queue_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
