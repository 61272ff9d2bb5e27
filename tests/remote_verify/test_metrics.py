"""/metrics and /healthz on the WebSocket port, and session ids in the logs."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.error
import urllib.request

import msgspec
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from local_draft.speculator import Speculator
from local_draft.verify_client import ServiceBusy, VerifyClient, VerifyError
from remote_verify.logs import JsonFormatter
from remote_verify.metrics import SOURCE_LABELS
from wire.protocol import (SUBPROTOCOL, Error, SamplingParams, SparseDist, Verdict, Verify, Welcome,
                           decode_server_message, encode)
from remote_verify.server import ServiceConfig, VerifyService
from tests.conftest import RunningService, hello_for


def scrape(url: str, token: str | None = None) -> tuple[str, dict[tuple[str, tuple], float]]:
    """The content type and every sample of /metrics, keyed by (name, sorted labels)."""
    request = urllib.request.Request(url.replace("ws://", "http://") + "/metrics",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return content_type, samples


def test_metrics_count_what_the_client_saw(own_llamacpp_target, close_draft):
    """Rounds, drafted and accepted tokens, acceptance per position and latency counts equal the
    client's own statistics; errors are counted by code and refusals by reason."""
    running = RunningService(own_llamacpp_target, token="t0ken")
    try:
        with pytest.raises(VerifyError):
            VerifyClient(running.url, hello_for(close_draft))  # no token: refused
        client = VerifyClient(running.url, hello_for(close_draft), token="t0ken")
        result = Speculator(close_draft, client, SamplingParams(), k=4).generate(
            close_draft.tokenize("def quicksort(arr):"), 40)
        with pytest.raises(VerifyError) as bad:
            client._request(b"not a message", Welcome)  # raw bytes: msgspec encodes them as a msgpack bin
        assert bad.value.code == "bad_frame"
        content_type, samples = scrape(running.url, "t0ken")
        client.close()
    finally:
        running.close()
    stats = result.stats
    assert content_type.startswith("text/plain; version=")  # the exposition format, not bare text
    assert samples[("specwire_rounds_total", ())] == stats.rounds
    assert samples[("specwire_drafted_tokens_total", ())] == stats.drafted
    assert samples[("specwire_accepted_tokens_total", ())] == stats.accepted
    # the Speculator names its drafter (the model) on every block it sends
    assert samples[("specwire_drafted_tokens_by_source_total", (("source", "model"),))] == stats.drafted
    assert samples[("specwire_accepted_tokens_by_source_total", (("source", "model"),))] == stats.accepted
    assert samples[("specwire_drafted_tokens_by_source_total", (("source", "unstated"),))] == 0
    for position, accepted in enumerate(stats.accepted_per_position):
        if accepted:
            assert samples[("specwire_accepted_at_position_total", (("position", str(position)),))] == accepted
    for position, drafted in enumerate(stats.drafted_per_position):
        assert samples[("specwire_drafted_at_position_total", (("position", str(position)),))] == drafted
    assert samples[("specwire_verify_seconds_count", ())] == stats.rounds
    assert samples[("specwire_queue_seconds_count", ())] == stats.rounds
    assert samples[("specwire_errors_total", (("code", "bad_frame"),))] == 1
    assert samples[("specwire_refusals_total", (("reason", "unauthorized"),))] == 1
    assert samples[("specwire_sessions_opened_total", ())] == 1 and samples[("specwire_sessions_open", ())] == 1
    assert samples[("specwire_ready", ())] == 1
    assert samples[("specwire_plain_streams", ())] == 0  # one session: no shared pass priced a plain one


def test_healthz_says_loading_until_the_target_is_loaded(own_llamacpp_target, close_draft):
    """While the target loads: /healthz 503 "loading", upgrades 503 with Retry-After (a client
    sees a busy service, not a dead one); once loaded: 200 and sessions are taken."""
    release = threading.Event()

    def slow_loader():
        release.wait(30)  # stands in for the minutes a large model takes to load
        return own_llamacpp_target

    service = VerifyService(slow_loader, ServiceConfig(port=0))
    thread = threading.Thread(target=lambda: asyncio.run(service.run(lambda url: None, handle_signals=False)),
                              daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: service.port is not None), "the port did not open"
        url = f"ws://127.0.0.1:{service.port}"
        health = f"http://127.0.0.1:{service.port}/healthz"
        with pytest.raises(urllib.error.HTTPError) as loading:
            urllib.request.urlopen(health, timeout=5)
        assert loading.value.code == 503 and loading.value.read() == b"loading\n"
        with pytest.raises(ServiceBusy) as busy:
            VerifyClient(url, hello_for(close_draft))
        assert "still loading" in str(busy.value) and busy.value.retry_after_s == 5.0
        release.set()
        assert wait_for(lambda: service.state == "ready")
        with urllib.request.urlopen(health, timeout=5) as response:
            assert response.status == 200
        VerifyClient(url, hello_for(close_draft)).close()
    finally:
        release.set()
        wait_for(lambda: service.state == "ready")
        service.stop()
        thread.join(10)


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def test_session_logs_carry_the_session_id(own_llamacpp_target, close_draft, caplog):
    """Opening and closing a session is logged with its id, as text and as a JSON field."""
    running = RunningService(own_llamacpp_target)
    try:
        with caplog.at_level(logging.INFO, logger="remote_verify.server"):
            with connect(running.url, subprotocols=[SUBPROTOCOL]) as ws:
                ws.send(encode(hello_for(close_draft)))
                session_id = decode_server_message(ws.recv()).session_id
            assert wait_for(lambda: any("closed after" in r.getMessage() for r in caplog.records))
    finally:
        running.close()
    mine = [r for r in caplog.records if getattr(r, "session", None) == session_id]
    assert any("opened" in r.getMessage() for r in mine) and any("closed" in r.getMessage() for r in mine)
    assert all(r.getMessage().startswith(f"session {session_id}: ") for r in mine)
    line = json.loads(JsonFormatter().format(mine[0]))
    assert line["session"] == session_id and line["level"] == "info" and "opened" in line["message"]


class VerifyBeforeDraftSource(msgspec.Struct, tag="verify"):
    """A Verify as clients encoded it before `draft_source` was appended: the key is absent."""

    seq: int
    committed_len: int
    append: list[int] = []
    draft: list[int] = []
    draft_dists: list[SparseDist] = []


def test_drafted_and_accepted_tokens_are_counted_by_draft_source(own_llamacpp_target, close_draft):
    """Real rounds naming "model", "ngram", an unknown name and none (an old client's frame) are
    counted under their own source label; an unknown name folds into "other", a long one is refused."""
    running = RunningService(own_llamacpp_target)
    expected = {label: [0, 0] for label in SOURCE_LABELS}  # label -> [drafted, accepted]
    rng = np.random.default_rng(0)
    rounds = [("draft-v9", "other"), ("model", "model"), ("ngram", "ngram"), (None, "unstated"),
              ("", "unstated")] * 3
    try:
        with connect(running.url, subprotocols=[SUBPROTOCOL]) as ws:
            ws.send(encode(hello_for(close_draft)))
            assert isinstance(decode_server_message(ws.recv()), Welcome)
            committed: list[int] = []
            pending = close_draft.tokenize("def quicksort(arr):")
            for seq, (source, label) in enumerate(rounds, start=1):
                draft, _ = close_draft.propose(committed + pending, 4, SamplingParams(), rng)
                fields = dict(seq=seq, committed_len=len(committed), append=pending, draft=draft)
                request = VerifyBeforeDraftSource(**fields) if source is None else Verify(**fields, draft_source=source)
                ws.send(encode(request))
                verdict = decode_server_message(ws.recv())
                assert isinstance(verdict, Verdict), verdict
                expected[label][0] += len(draft)
                expected[label][1] += verdict.accepted
                committed += pending + draft[:verdict.accepted] + [verdict.token]
                pending = []
            ws.send(encode(Verify(seq=len(rounds) + 1, committed_len=len(committed), draft=[1],
                                  draft_source="n" * 17)))
            refused = decode_server_message(ws.recv())
            assert isinstance(refused, Error) and refused.code == "bad_request" and not refused.fatal
            assert "draft_source is longer than 16 characters" in refused.message
        _, samples = scrape(running.url)  # a service without a token: open
    finally:
        running.close()
    assert all(accepted > 0 for _, accepted in expected.values()), expected  # every label is really exercised
    for label, (drafted, accepted) in expected.items():
        assert samples[("specwire_drafted_tokens_by_source_total", (("source", label),))] == drafted, label
        assert samples[("specwire_accepted_tokens_by_source_total", (("source", label),))] == accepted, label
    labels = {dict(key[1])["source"] for key in samples if key[0] == "specwire_drafted_tokens_by_source_total"}
    assert labels == set(SOURCE_LABELS)  # "draft-v9" made no series of its own
    assert samples[("specwire_drafted_tokens_total", ())] == sum(d for d, _ in expected.values())


def test_metrics_are_behind_the_token_unless_made_public(new_llamacpp_target):
    """A service with a token answers /metrics only with it (401 without, as the WebSocket does);
    public_metrics (`serve --public-metrics`) serves it to a scraper that has none. Without a token
    there is nothing to ask for."""
    guarded = RunningService(new_llamacpp_target(), token="t0ken")
    public = RunningService(new_llamacpp_target(), token="t0ken", public_metrics=True)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(guarded.url)
        assert refused.value.code == 401 and b"missing bearer token" in refused.value.read()
        with pytest.raises(urllib.error.HTTPError) as wrong:
            scrape(guarded.url, "guess")
        assert wrong.value.code == 401
        assert scrape(guarded.url, "t0ken")[1][("specwire_ready", ())] == 1
        assert scrape(public.url)[1][("specwire_ready", ())] == 1
    finally:
        guarded.close()
        public.close()


def test_kv_cache_slots_follow_the_pools_not_the_sessions(own_llamacpp_target, close_draft):
    """specwire_kv_cache_slots counts the KV slots the llama.cpp pools hold: a pool doubles as
    sessions arrive (1, 2, 4), keeps its size while some stay (it shrinks later), and every pool
    is freed when the last session closes. An operator reads a replica's memory against it."""
    running = RunningService(own_llamacpp_target)
    clients = []
    try:
        def slots() -> float:
            return scrape(running.url)[1][("specwire_kv_cache_slots", ())]

        assert slots() == 0
        for opened, pool in ((1, 1), (2, 2), (3, 4)):
            clients.append(VerifyClient(running.url, hello_for(close_draft)))
            assert wait_for(lambda: slots() == pool), f"{opened} sessions: {slots()} slots, not {pool}"
        clients.pop().close()
        assert wait_for(lambda: scrape(running.url)[1][("specwire_sessions_open", ())] == 2)
        assert slots() == 4  # two sessions left in a pool of four: kept (a quarter or fewer shrinks, later)
        while clients:
            clients.pop().close()
        assert wait_for(lambda: slots() == 0), "the last session's close did not free the pools"
    finally:
        for client in clients:
            client.close()
        running.close()
