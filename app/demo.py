"""`specwire demo`: the whole pipeline on one machine with the tiny models.

Builds the tiny models (once, into the cache directory), starts a verification service in
a child process, generates each demo prompt target-only (k = 0) and with speculation, and
shows that the tokens are identical and what speculation saved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO_PROMPTS = ["def quicksort(arr):", "The quick brown fox", "import numpy as np"]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specwire"


def start_service(target: Path) -> tuple[subprocess.Popen, str]:
    """Start `specwire serve` on a free loopback port; return the process and its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--target", str(target), "--port", "0"],
        stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError("the verification service did not start (see the messages above)")
    return process, line.split()[-1]


def run_demo(k: int, max_tokens: int) -> int:
    from local_draft.draft_model import DraftModel
    from local_draft.speculator import Speculator
    from local_draft.verify_client import VerifyClient
    from remote_verify.protocol import Hello, SamplingParams

    models_dir = cache_dir() / "tiny"
    print(f"building tiny models in {models_dir} ...", flush=True)
    subprocess.run([sys.executable, "-m", "app.cli", "models", "tiny", str(models_dir)], check=True,
                   stdout=subprocess.DEVNULL)
    service, url = start_service(models_dir / "target")
    print(f"verification service listening on {url}\n", flush=True)
    try:
        draft = DraftModel(models_dir / "draft.gguf")
        params = SamplingParams()  # greedy: output must equal the target's token for token
        hello = Hello(vocab_fingerprint=draft.vocab_fingerprint, vocab_size=draft.vocab_size,
                      bos_id=draft.bos_id, eos_id=draft.eos_id, sampling=params, client="specwire demo")
        client = VerifyClient(url, hello)
        header = f"{'prompt':24s} {'mode':8s} {'rounds':>6s} {'accept':>7s} {'tok/round':>9s} {'tok/s':>8s}  same tokens"
        print(header + "\n" + "-" * len(header))
        for prompt in DEMO_PROMPTS:
            ids = draft.tokenize(prompt)
            alone = Speculator(draft, client, params, k=0).generate(ids, max_tokens)
            hybrid = Speculator(draft, client, params, k=k).generate(ids, max_tokens)
            same = "yes" if hybrid.token_ids == alone.token_ids else "NO"
            for mode, result in ((f"k=0", alone), (f"k={k}", hybrid)):
                s = result.stats
                print(f"{prompt[:24]:24s} {mode:8s} {s.rounds:6d} {s.acceptance_rate:7.2f} "
                      f"{s.tokens_per_round:9.2f} {s.tokens_per_s:8.1f}  {same if mode != 'k=0' else ''}")
        client.close()
        print("\nThe tiny models are random weights: the text is noise, the machinery is real.")
    finally:
        service.terminate()
        service.wait(timeout=30)
    return 0
