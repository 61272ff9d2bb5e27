"""The speculation loop at its limits: a full draft context, drafting ahead included."""

from __future__ import annotations

import pytest

from local_draft.draft_model import DraftModel
from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from wire.protocol import SamplingParams
from tests.conftest import hello_for


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "ahead"])
def test_a_full_draft_context_ends_the_reply_and_the_session_goes_on(tiny, service_on, pipeline):
    """A 64-token drafter context: the reply stops with "context", and the next one is served normally."""
    draft = DraftModel(tiny.draft, n_ctx=64)
    client = VerifyClient(service_on("llamacpp").url, hello_for(draft))
    speculator = Speculator(draft, client, SamplingParams(), k=8, pipeline=pipeline)
    prompt = draft.tokenize("def f(x):")
    long = speculator.generate(prompt, 500)
    assert long.stop_reason == "context" and len(prompt) + len(long.token_ids) <= 64
    short = speculator.generate(prompt, 10)  # no verdict left unread, no stale sequence number
    assert short.stop_reason == "max_tokens" and short.token_ids == long.token_ids[:10]
    client.close()
