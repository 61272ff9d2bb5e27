"""What a JSON schema's mask costs the service on this CPU, on the default pair's target.

    python -m benchmarks.mask_cost [--replies 4] [--max-tokens 64] [--threads 2]

`--mode server` (the target alone, streamed) on the real Qwen2.5-Coder 1.5B GGUF from the model
cache, the same prompts with a schema and without, the two taking turns reply by reply (each going
first half the time) so that a machine whose load drifts slows both alike. It reports tokens/s
each way and their ratio, and, timed inside the service, what the grammar's work takes per token
(following the matcher, computing the mask, masking the logits: remote_verify/session.py
`_row_logits`) against the pass's own time. The schema (an object with an enum array and a
bounded string) is benchmarks/structured_speed.py's.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.structured_speed import PROMPTS, SCHEMA, _service

CACHE = "~/.cache/specwire/models/qwen2.5-coder"
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFTER = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # its tokenizer only: prompts and end tokens


def main() -> None:
    from pathlib import Path

    from local_draft.draft_model import DraftModel
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.verify_client import VerifyClient
    from remote_verify import session as session_module
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget
    from wire.protocol import Grammar, SamplingParams

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replies", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    cache = Path(CACHE).expanduser()
    grammar_s = []  # seconds of each masked row's grammar work, as the service spends them
    true_row_logits = session_module.Session._row_logits

    def timed_row_logits(self, result, row, before):
        began = time.perf_counter()
        logits = true_row_logits(self, result, row, before)
        if self.grammar is not None:
            grammar_s.append(time.perf_counter() - began)
        return logits

    session_module.Session._row_logits = timed_row_logits
    target = LlamaCppTarget(cache / TARGET, gpu_layers=0, n_threads=args.threads)
    url, stop = _service(target, start_timeout_s=900)  # it times its pass costs first: minutes on a busy CPU
    tokenizer = DraftModel(cache / DRAFTER, n_ctx=512, n_threads=1)
    client = VerifyClient(url, tokenizer.hello(SamplingParams(), client="mask-cost"))
    prompts = [tokenizer.tokenize(p) for p in (PROMPTS * args.replies)[: args.replies]]
    generators = {"no grammar": ServerOnlyGenerator(client, tokenizer.end_ids),
                  "schema": ServerOnlyGenerator(client, tokenizer.end_ids,
                                                grammar=Grammar("json_schema", json.dumps(SCHEMA)))}
    spent, made, forward_s = {k: 0.0 for k in generators}, {k: 0 for k in generators}, {k: 0.0 for k in generators}
    try:
        generators["no grammar"].generate(prompts[0], 4)  # warm: the first pass loads weights into the cache
        for i, prompt in enumerate(prompts):
            for label in (list(generators) if i % 2 == 0 else list(generators)[::-1]):
                began = time.perf_counter()
                result = generators[label].generate(prompt, args.max_tokens)
                spent[label] += time.perf_counter() - began
                made[label] += len(result.token_ids)
                forward_s[label] += result.stats.forward_s
    finally:
        client.close()
        stop()
    rates = {label: made[label] / spent[label] for label in generators}
    for label in generators:
        print(f"{label}: {made[label]} tokens, {rates[label]:.2f} tokens/s, "
              f"{1e3 * forward_s[label] / made[label]:.1f} ms of the service's passes a token")
    mean_mask_ms = 1e3 * sum(grammar_s) / max(len(grammar_s), 1)
    print(f"the grammar's work in the service: {mean_mask_ms:.2f} ms a token over {len(grammar_s)} tokens "
          f"({mean_mask_ms / (1e3 * forward_s['schema'] / made['schema']):.1%} of a pass)")
    print(f"schema / no grammar tokens/s: {rates['schema'] / rates['no grammar']:.3f}")


if __name__ == "__main__":
    main()
