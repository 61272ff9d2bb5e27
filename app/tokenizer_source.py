"""Where a client with no draft model (`--draft ngram`) gets its tokenizer: the one place to change it.

For now it is the vocabulary of a GGUF file, loaded by llama.cpp with `vocab_only` (no
weights are read: a few MB of memory and well under a second), by default the draft GGUF
of the chosen pair, as `--mode server` does. A tokenizer the service sends would plug in
here; whatever it returns must offer what the client uses of a DraftModel: tokenize,
token_bytes, end_ids, hello(), chat_template, token_text, bos_id, eos_id, path.
"""

from __future__ import annotations

from app.model_paths import resolve_model
from app.user_error import UserError


def open_tokenizer(path, n_ctx: int = 4096):
    """The tokenizer held by the GGUF at `path` (DraftModelError if it cannot be read): the one
    place that decides where a client with no model tokenizes (`generate` and `chat` both ask here)."""
    from local_draft.draft_model import DraftModel

    return DraftModel(path, n_ctx=n_ctx, vocab_only=True)


def load_tokenizer(explicit: str | None, pair_name: str | None, n_ctx: int = 4096):
    """The tokenizer of the GGUF `explicit` names, else of the pair's draft GGUF; UserError if there is none."""
    from local_draft.draft_model import DraftModelError

    try:
        return open_tokenizer(resolve_model(explicit, pair_name, "draft"), n_ctx=n_ctx)
    except DraftModelError as exc:
        raise UserError(f"{exc} (n-gram drafting needs the pair's tokenizer: a GGUF file of the pair, "
                        f"given with --tokenizer, or `specwire models fetch`)") from exc
