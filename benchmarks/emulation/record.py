"""Record the default pair's greedy decisions for the emulator (benchmarks/emulation/recording.py).

    .venv/bin/python -m benchmarks.emulation.record [--tokens 256] [--out FILE] [--draft GGUF] [--target GGUF]

Starts a real verification service on the target (llama.cpp, as `specwire serve` runs it:
batch-invariant kernels, so its greedy path is the one every mode commits), streams each
prompt's greedy continuation from it (`--mode server`), then evaluates the draft model token
by token along that path and keeps its argmax at every position. About five minutes for the
default prompt set at 256 tokens on two CPU cores.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
from pathlib import Path

from app.bench.prompts import PROMPTS
from app.demo import start_service
from benchmarks.emulation.recording import DEFAULT_RECORDING, Recorded, Recording

log = logging.getLogger(__name__)


def record(draft_path: Path, target_path: Path, max_tokens: int) -> Recording:
    from local_draft.draft_model import DraftModel
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.verify_client import VerifyClient
    from wire.protocol import SamplingParams

    draft = DraftModel(draft_path, n_ctx=4096)
    service, url = start_service(target_path, "--max-context", "4096")
    entries = []
    try:
        client = VerifyClient(url, draft.hello(SamplingParams(), client="benchmarks.emulation.record"))
        streamed = ServerOnlyGenerator(client, draft.end_ids)
        for kind, texts in PROMPTS.items():
            for text in texts:
                prompt = draft.tokenize(text)
                result = streamed.generate(prompt, max_tokens)
                path = result.token_ids
                guesses = []
                for i in range(len(path)):
                    tokens, _ = draft.propose(prompt + path[:i], 1, SamplingParams(), rng=None)
                    guesses.append(tokens[0])
                right = sum(g == t for g, t in zip(guesses, path))
                log.info("%s %r: %d tokens (%s), the drafter's guess right at %d of them",
                         kind, text[:30], len(path), result.stop_reason, right)
                entries.append(Recorded(kind, text, prompt, path, guesses, result.stop_reason))
        client.close()
    finally:
        service.terminate()
        service.wait(timeout=60)
    about = {"draft": draft_path.name, "target": target_path.name, "max_tokens": max_tokens,
             "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {platform.processor()}",
             "service": "specwire serve (llama.cpp, batch-invariant), --mode server"}
    return Recording(entries, about)


def main() -> None:
    from models.registry import file_path, get_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="tokens recorded per prompt (fewer at an end token)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RECORDING)
    parser.add_argument("--draft", type=Path, help="draft GGUF (default: the default pair's)")
    parser.add_argument("--target", type=Path, help="target GGUF (default: the default pair's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pair = get_pair()
    draft = args.draft or file_path(pair, pair.draft)
    target = args.target or file_path(pair, pair.target)
    recording = record(Path(draft), Path(target), args.tokens)
    recording.save(args.out)
    print(f"wrote {len(recording.entries)} prompts to {args.out}")


if __name__ == "__main__":
    main()
