"""The outside reference: Hugging Face assisted generation with the same pair, in torch.

transformers' `generate(assistant_model=...)` runs both models in one process (no network),
with its own draft-length schedule. Both GGUF files are de-quantized once into the cache
(models/gguf_to_hf.py), float32 on the CPU. The target's forward passes and their time are
counted with hooks, so the reference reports the same columns as the other modes.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from app.bench.modes import Run
from app.bench.runner import WARM_UP_PROMPT, WARM_UP_TOKENS, BenchConfig, bench_prompts

log = logging.getLogger(__name__)


def reference_available() -> str | None:
    """None when the reference can run here, else why not."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return "transformers and torch are not installed (pip install 'specwire[server]')"
    return None


def run_reference(config: BenchConfig, progress: Callable[[int, int], None]) -> list[Run]:
    import torch
    from transformers import AutoModelForCausalLM

    from local_draft.draft_model import DraftModel
    from models.gguf_to_hf import ensure_converted

    def load(path):
        folder = ensure_converted(path, "float32") if path.is_file() else path
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    vocab = DraftModel(config.draft, vocab_only=True)  # the same token ids as every other mode
    target, assistant = load(config.target), load(config.draft)
    busy = _ForwardClock(target)
    prompts = bench_prompts(config)
    runs = []

    @torch.inference_mode()
    def generate(ids: list[int], max_tokens: int):
        timer = _FirstTokenTimer()
        input_ids = torch.tensor([ids])
        output = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=assistant,
                                 do_sample=not config.params.greedy, temperature=config.params.temperature or None,
                                 top_k=config.params.top_k or None, top_p=config.params.top_p,
                                 max_new_tokens=max_tokens, eos_token_id=vocab.eos_id, pad_token_id=vocab.eos_id,
                                 streamer=timer)
        return output[0, len(ids):].tolist(), timer

    generate(vocab.tokenize(WARM_UP_PROMPT), WARM_UP_TOKENS)
    for done, (kind, index, text) in enumerate(prompts):
        ids = vocab.tokenize(text)
        busy.reset()
        started = time.perf_counter()
        tokens, timer = generate(ids, config.max_tokens)
        wall = time.perf_counter() - started
        runs.append(Run(mode="hf-assisted", rtt_ms=0.0, prompt_kind=kind, prompt_index=index, tokens=len(tokens),
                        wall_s=wall, first_token_s=(timer.first_at or started + wall) - started,
                        target_passes=busy.passes, service_s=busy.seconds, round_trips=0, bytes=0,
                        token_ids=tokens))
        progress(done + 1, len(prompts))
    return runs


class _ForwardClock:
    """Counts a model's forward passes and the time spent in them."""

    def __init__(self, model):
        self.reset()
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def reset(self) -> None:
        self.passes, self.seconds, self._started = 0, 0.0, 0.0

    def _before(self, *_) -> None:
        self._started = time.perf_counter()

    def _after(self, *_) -> None:
        self.passes += 1
        self.seconds += time.perf_counter() - self._started


class _FirstTokenTimer:
    """A transformers streamer that notes when the first new token arrives."""

    def __init__(self):
        self.first_at: float | None = None
        self._calls = 0

    def put(self, value) -> None:
        self._calls += 1  # the first call carries the prompt
        if self._calls == 2 and self.first_at is None:
            self.first_at = time.perf_counter()

    def end(self) -> None:
        pass
