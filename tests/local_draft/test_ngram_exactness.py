"""N-gram and mixed drafting through the real protocol: greedy parity and the target's distribution.

The tiny target is random, so ordinary prompts give the n-gram drafter little to copy. The
prompts where it matters repeat themselves as a reply would repeat its context: the prompt,
the target's own greedy continuation of it, then the prompt again, so that the n-gram
drafter proposes that continuation (the target's likeliest tokens, accepted about half of
the time at temperature 1: both acceptance and the residual are taken).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from tests.conftest import hello_for
from tests.forked_seeds import map_seeds, service_here
from tests.local_draft.test_sampling_exactness import Tally
from tests.statistics import ALPHA, detectable_shift
from wire.protocol import SamplingParams

ORDINARY = ["def quicksort(arr):", "The quick brown fox", "1, 2, 3, 5, 8,", "<html><body>", "A"]
REPEATED = ["The", "def f(x):", "x = 1\ny = 2\n", "hello world", "for i in range(10):"]
MAX_TOKENS = 40


def repeating_prompt(backend, draft, text: str, echo: int = 6) -> list[int]:
    """`text`, the target's greedy continuation of it (`echo` tokens), then `text` again."""
    ids = draft.tokenize(text)
    context = list(ids)
    for _ in range(echo):
        context.append(int(np.argmax(backend.forward(backend.new_cache(), context, n_logits=1)[0])))
    return context + ids


@pytest.fixture(scope="module")
def llamacpp_service(service_on):
    return service_on("llamacpp")


@pytest.fixture(scope="module")
def prompts(llamacpp_service, close_draft):
    backend = llamacpp_service.backend
    return ([close_draft.tokenize(text) for text in ORDINARY]
            + [repeating_prompt(backend, close_draft, text) for text in REPEATED])


@pytest.fixture(scope="module")
def reference(llamacpp_service, close_draft, prompts):
    """Target-only output (k = 0) for every prompt."""
    client = VerifyClient(llamacpp_service.url, hello_for(close_draft))
    speculator = Speculator(close_draft, client, SamplingParams(), k=0)
    outputs = [speculator.generate(prompt, MAX_TOKENS).token_ids for prompt in prompts]
    client.close()
    return outputs


# (drafting, k, drafting ahead)
LOOPS = [("ngram", 3, False), ("ngram", None, False), ("mixed", 4, False), ("mixed", None, True)]


@pytest.mark.parametrize("drafting, k, pipeline", LOOPS, ids=["ngram-k3", "ngram-auto", "mixed-k4", "mixed-auto-ahead"])
def test_greedy_ngram_and_mixed_drafting_are_token_identical_to_the_target(llamacpp_service, close_draft, prompts,
                                                                          reference, drafting, k, pipeline):
    """Every prompt, n-gram alone (no model) and mixed: the same tokens as the target alone."""
    client = VerifyClient(llamacpp_service.url, hello_for(close_draft))
    draft = None if drafting == "ngram" else close_draft
    speculator = Speculator(draft, client, SamplingParams(), k=k, pipeline=pipeline, drafting=drafting,
                            end_ids=close_draft.end_ids)
    ngram_accepted = 0
    sources = set()
    for prompt, expected in zip(prompts, reference):
        result = speculator.generate(prompt, MAX_TOKENS)
        assert result.token_ids == expected, f"diverged on {prompt!r}"
        counts = result.stats.by_source
        sources |= set(counts)
        ngram_accepted += counts["ngram"].accepted if "ngram" in counts else 0
    client.close()
    # n-gram drafts were made and accepted (mixed takes them only where they beat the close drafter)
    assert ngram_accepted >= (10 if drafting == "ngram" else 1), ngram_accepted
    assert sources == ({"ngram"} if drafting == "ngram" else {"ngram", "model"}), sources


@pytest.mark.parametrize("drafting", ["ngram", "mixed"])
def test_generate_with_ngram_drafts_on_the_command_line_matches_the_target(llamacpp_service, close_draft, tiny,
                                                                          prompts, drafting):
    """`generate --draft ngram` (and `--mix-ngram`) `--seed 7 --temperature 0` gives the target-alone tokens,
    in the round-based mode and in the default one."""
    # A repeating prompt as text a user could type (its ids may differ at the seams once retyped),
    # and the target's own output for it, with n-gram drafts accepted in-process.
    client = VerifyClient(llamacpp_service.url, hello_for(close_draft))
    alone = Speculator(close_draft, client, SamplingParams(), k=0)
    copying = Speculator(None, client, SamplingParams(), k=None, drafting="ngram", end_ids=close_draft.end_ids)
    typed, expected = None, None
    for prompt in prompts[len(ORDINARY):]:
        text = b"".join(close_draft.token_bytes(t) for t in prompt).decode("utf-8", errors="replace")
        ids = close_draft.tokenize(text)
        if "ngram" in copying.generate(ids, MAX_TOKENS).stats.by_source:
            typed, expected = text, alone.generate(ids, MAX_TOKENS).token_ids
            break
    client.close()
    assert typed is not None, "no repeating prompt typed as text gets n-gram drafts"
    how = (["--draft", "ngram", "--tokenizer", str(tiny.draft)] if drafting == "ngram"
           else ["--draft", str(tiny.draft), "--mix-ngram"])
    for mode in ("rounds", "hybrid"):  # hybrid, the default, guesses only while that pays: exactness alone
        run = subprocess.run(
            [sys.executable, "-m", "app.cli", "generate", *how, "--mode", mode,
             "--server", llamacpp_service.url, "--prompt", typed, "--max-tokens", str(MAX_TOKENS),
             "--temperature", "0", "--seed", "7", "--json"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        assert result["token_ids"] == expected, mode
        assert result["drafting"] == drafting
        if drafting == "ngram" and mode == "rounds":  # (mixed copies only where it beats the close drafter)
            assert result["stats"]["by_source"]["ngram"]["accepted"] > 0, result["stats"]


def test_generate_with_draft_ngram_and_no_service_is_a_clear_error(tiny):
    """No service and no model to fall back on: exit 1 with a message saying so, not a traceback."""
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", "generate", "--draft", "ngram", "--tokenizer", str(tiny.draft),
         "--server", "ws://127.0.0.1:9", "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr and "127.0.0.1:9" in run.stderr, run.stderr


# The first three tokens after a repeating prompt, temperature 1: the n-gram drafter proposes the
# target's greedy continuation (p about 0.48 for the first token), so a draft is accepted about
# half the time and otherwise corrected from the residual. Power, from tests/statistics.py's
# detectable_shift at this sample size, is asserted below (a shift of mass between the two
# likeliest outcomes caught 90% of the time); the planted bugs of a q of 0.5 on the point mass,
# or the model's distribution sent for an n-gram token, move far more than that.
NGRAM_PARAMS = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
NGRAM_SAMPLES = 3_000
NGRAM_POWER = 0.04  # the largest shift the test must catch at NGRAM_SAMPLES


@pytest.mark.parametrize("drafting", ["ngram", "mixed"])
def test_sampled_ngram_and_mixed_drafts_follow_the_target(llamacpp_service, close_draft, drafting):
    """NGRAM_SAMPLES seeded generations: the first three tokens fit the target's exact joint distribution."""
    service = llamacpp_service
    prompt = repeating_prompt(service.backend, close_draft, "The")
    tally = Tally(service, close_draft, NGRAM_PARAMS, 3, prompt=prompt)
    power = detectable_shift(tally.exact, NGRAM_SAMPLES)
    assert power <= NGRAM_POWER, power
    draft = None if drafting == "ngram" else close_draft
    k, pipeline, max_k = (2, False, 16) if drafting == "ngram" else (None, True, 2)
    start = 7_000_000 if drafting == "ngram" else 8_000_000  # seeds no other case uses

    def generations(seeds: range) -> list:
        with service_here(service) as url:
            client = VerifyClient(url, hello_for(close_draft, NGRAM_PARAMS, seed=1))
            made = []
            for seed in seeds:
                speculator = Speculator(draft, client, NGRAM_PARAMS, k=k, seed=seed, pipeline=pipeline,
                                        max_k=max_k, drafting=drafting, end_ids=close_draft.end_ids)
                speculator.reseed(seed)
                made.append(speculator.generate(prompt, 4))
            client.close()
        return made

    ngram = model = 0
    for result in map_seeds(generations, range(start, start + NGRAM_SAMPLES)):
        tally.add(result)
        ngram += result.stats.by_source["ngram"].drafted if "ngram" in result.stats.by_source else 0
        model += result.stats.by_source["model"].drafted if "model" in result.stats.by_source else 0
    pvalue = tally.pvalue()
    print(f"{drafting}: p = {pvalue:.4f} (catches a {power:.3f} shift 90% of the time), "
          f"ngram drafted {ngram}, model drafted {model}, "
          f"acceptance {tally.accepted / max(tally.drafted, 1):.2f}")
    assert pvalue > ALPHA
    assert 0.2 < tally.accepted / tally.drafted < 0.9  # acceptance and the residual were both taken
    if drafting == "ngram":
        assert ngram > NGRAM_SAMPLES, ngram  # the n-gram drafter drafted in every generation
    else:  # both drafters drafted in many generations
        assert ngram > 0.3 * NGRAM_SAMPLES and model > 0.3 * NGRAM_SAMPLES, (ngram, model)


def test_generate_with_draft_ngram_and_no_model_file_tokenizes_with_the_services_vocabulary(
        llamacpp_service, close_draft, tmp_path):
    """No --tokenizer and no pair on this machine: the service's vocabulary tokenizes, output is the target's."""
    client = VerifyClient(llamacpp_service.url, hello_for(close_draft))
    expected = Speculator(close_draft, client, SamplingParams(), k=0).generate(
        close_draft.tokenize(ORDINARY[0]), MAX_TOKENS).token_ids
    client.close()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "SPECWIRE_CONFIG": str(tmp_path / "none.toml")}
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", "generate", "--draft", "ngram", "--server", llamacpp_service.url,
         "--prompt", ORDINARY[0], "--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--json"],
        capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["token_ids"] == expected
    assert list((tmp_path / "cache" / "specwire" / "vocab").glob("*.gguf"))  # it came from the service
