"""Fixtures for the endpoint's tests: a tiny service and `specwire api` in child processes, and references.

Everything is real: the verification service on the tiny GGUF target (llama.cpp), `specwire api`
on the tiny drafter, started as a user starts them, on port 0; references come from
`specwire generate --mode server` (the target alone, streaming) with the same prompt text.
The service's passes are held to PASS_MS, as a GPU's would take about that for one token or a
few (`benchmarks.emulation.serve`, the same service with each pass paced): the tiny target
alone makes a token faster than any drafter guesses one, and the default mode keeps guesses
only where the drafter keeps ahead of the stream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

SPECWIRE = str(Path(sys.executable).parent / "specwire")
REPO = Path(__file__).resolve().parents[3]
# The children run this tree's code (the `specwire` script alone would import the installed copy's)
CHILD_ENV = {**os.environ, "PYTHONPATH": str(REPO)}
PASS_MS = 4.0
PROFILE = f'name = "tests-gpu"\nkind = "target"\npass_ms = [[1, {PASS_MS}], [64, {PASS_MS * 1.1}]]\n'


def start_service(target: Path, port: int = 0) -> tuple[subprocess.Popen, str]:
    """The service on the tiny GGUF target, each pass paced to PASS_MS, port 0; the process and its ws:// URL."""
    profile = target.parent / "tests-gpu.toml"
    profile.write_text(PROFILE)
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.emulation.serve", "--profile", str(profile),
                                "--target", str(target), "--port", str(port)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    assert line.startswith("listening on ws://127.0.0.1:"), line
    return process, line.split()[-1]


def service_metric(url: str, name: str) -> float:
    """A value from the service's /metrics (Prometheus text), summed over its labels."""
    text = urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {")


@dataclass
class Endpoint:
    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT/v1

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_endpoint(draft: Path, *flags: str) -> Endpoint:
    """`specwire api` on port 0 with the tiny drafter and `flags`; ready when it prints its URL."""
    process = subprocess.Popen([SPECWIRE, "api", "--port", "0", "--draft", str(draft), "--draft-threads", "1",
                                *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV)
    line = process.stdout.readline()
    if not line.startswith("listening on http://127.0.0.1:"):
        process.kill()
        raise AssertionError(f"specwire api did not start: {line!r} {process.stderr.read()[-2000:]}")
    return Endpoint(process, line.split()[-1])


@pytest.fixture(scope="module")
def tiny_service(tiny):
    """The tiny verification service a module's endpoints verify against: its URL."""
    process, url = start_service(tiny.target_gguf)
    yield url
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def endpoint(tiny, tiny_service):
    """`specwire api --server` the module's tiny service: one drafter, adaptive k (the defaults)."""
    running = start_endpoint(tiny.draft, "--server", tiny_service)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def chat_prompt(tiny):
    """chat_prompt(messages): the prompt text the draft GGUF's chat template makes of them."""
    from local_draft.chat_template import Message, template_for
    from local_draft.draft_model import DraftModel

    tokenizer = DraftModel(tiny.draft, vocab_only=True)
    bos = tokenizer.token_text(tokenizer.bos_id).decode()
    eos = tokenizer.token_text(tokenizer.eos_id).decode()
    template = template_for(tokenizer.chat_template, bos, eos)
    return lambda messages: template.render([Message(m["role"], m["content"]) for m in messages])


def generate_reference(draft: Path, url: str, prompt: str, max_tokens: int) -> dict:
    """`specwire generate --mode server --json` on `prompt` against the service at `url`: the target alone."""
    done = subprocess.run([SPECWIRE, "generate", "--mode", "server", "--json", "--server", url, "--draft", str(draft),
                           "--prompt", prompt, "--max-tokens", str(max_tokens)],
                          capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def reference(tiny, tiny_service):
    """reference(prompt_text, max_tokens): generate_reference against the module's service (cached)."""
    cache: dict = {}

    def run(prompt: str, max_tokens: int) -> dict:
        if (prompt, max_tokens) not in cache:
            cache[prompt, max_tokens] = generate_reference(tiny.draft, tiny_service, prompt, max_tokens)
        return cache[prompt, max_tokens]

    return run
