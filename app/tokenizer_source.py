"""Where a client with no draft model (`--draft ngram`) gets its tokenizer: the one place that decides.

In order: the GGUF `--tokenizer` names; else the service's own vocabulary (`GET /vocab.gguf`,
local_draft/remote_vocab.py: the target's tokenizer, cached after the first download), so a
thin client needs no model file at all; else the chosen pair's draft GGUF, when this machine
has it (a service that does not offer its vocabulary, or a chat whose service is not started
yet). Only the vocabulary is read (llama.cpp `vocab_only`: a few MB, well under a second).
Whatever it returns offers what the client uses of a DraftModel: tokenize, token_bytes,
end_ids, hello(), chat_template, token_text, bos_id, eos_id, path.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.model_paths import resolve_model
from app.user_error import UserError

log = logging.getLogger(__name__)


def tokenizer_path(explicit: str | None, pair_name: str | None, server: str | None = None,
                   token: str | None = None, ca_file: str | None = None) -> Path:
    """The GGUF to tokenize with, by the order above; UserError saying every source tried."""
    from local_draft.remote_vocab import RemoteVocabError, fetch_vocab

    if explicit:
        return Path(explicit)
    from_service = None
    if server:
        try:
            return fetch_vocab(server, token, ca_file)
        except RemoteVocabError as exc:
            from_service = exc
            log.info("no vocabulary from the service (%s): trying the pair's draft GGUF", exc)
    try:
        return Path(resolve_model(None, pair_name, "draft"))
    except UserError as exc:
        if from_service is None:
            raise
        raise UserError(f"n-gram drafting needs the pair's tokenizer: the service did not give it ({from_service}), "
                        f"and {exc}") from exc


def open_tokenizer(path, n_ctx: int = 4096):
    """The tokenizer held by the GGUF at `path` (DraftModelError if it cannot be read)."""
    from local_draft.draft_model import DraftModel

    return DraftModel(path, n_ctx=n_ctx, vocab_only=True)


def load_tokenizer(explicit: str | None, pair_name: str | None, server: str | None = None,
                   token: str | None = None, ca_file: str | None = None, n_ctx: int = 4096):
    """The tokenizer by the order above, loaded; UserError if there is none."""
    from local_draft.draft_model import DraftModelError

    path = tokenizer_path(explicit, pair_name, server, token, ca_file)
    try:
        return open_tokenizer(path, n_ctx=n_ctx)
    except DraftModelError as exc:
        raise UserError(f"{exc} (n-gram drafting needs the pair's tokenizer: a GGUF file of the pair, "
                        f"given with --tokenizer, or `specwire models fetch`)") from exc
