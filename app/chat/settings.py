"""The chat's settings: one frozen object, made from the command line by `launch`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wire.protocol import SamplingParams
from wire.threads import DRAFT_THREADS


@dataclass(frozen=True)
class ChatSettings:
    draft: Path  # the draft model GGUF (resolved before the app starts: without it nothing runs);
    # with drafting "ngram", the GGUF whose vocabulary tokenizes (no model runs here)
    drafting: str = "model"  # "model", "mixed" (n-gram drafts where they pay) or "ngram" (no model)
    target: str | None = None  # the embedded service's target file, resolved at launch; None: see target_problem
    target_problem: str | None = None  # why there is no target (shown when the service would start)
    pair: str | None = None
    backend: str = "auto"  # the embedded service's backend
    server: str | None = None  # a remote service's URL; None: the embedded service
    token: str | None = None
    ca_file: str | None = None
    offline: bool = False  # start offline (online later with /online)
    # "hybrid": the service streams, the drafter guesses ahead (the default); "rounds": draft a block,
    # wait for its verdict (marks on screen then follow the blocks, not the timing: tests pin it)
    mode: str = "hybrid"
    k: int | None = None  # guesses ahead (rounds: draft tokens per round); None: adaptive ("auto"); 0: none
    params: SamplingParams = SamplingParams()
    seed: int | None = None
    system: str | None = None  # None: keep the resumed chat's system prompt (or have none)
    max_tokens: int = 1024  # per reply
    context: int = 4096  # the drafter's context; the service's limit applies too
    draft_gpu_layers: int = -1
    draft_threads: int = DRAFT_THREADS  # the embedded service gets the physical cores left (wire/threads.py)
    resume: Path | None = None  # a saved chat to continue
    chats_dir: Path | None = None  # None: $XDG_DATA_HOME/specwire/chats
    marks: bool = True  # start with raw text coloured by token (False: rendered Markdown, code by token, prose by gutter; ctrl+t switches)
    restart_service: bool = True  # restart the embedded service if it dies
    steady_display: bool = False  # no timings and no blinking cursor: screens that compare equal (tests)

    @property
    def embedded(self) -> bool:
        return self.server is None
