"""Constrained decoding: a Grammar (wire/protocol.py) compiled to a token mask per state.

Both ends use it: the service masks the target's logits before warp and the race, so what
it commits is the constrained target alone; the drafter masks its own, so that its guesses
stay inside the grammar (a guess outside could never equal the target's pick). The library
is llguidance (chosen by measurement: docs/structured-output.md): it works on token ids with
a tokenizer built from the vocabulary's token bytes, compiles a JSON schema lazily (1.7 ms
against outlines-core's 2.1 s on the 151,936-token Qwen vocabulary), computes a mask in
0.09 ms a token, rolls back, and pulls in neither torch nor transformers (xgrammar needs
both: the client must stay light).

A `TokenConstraint` follows the tokens made since the grammar's start: `follow` rolls the
matcher back to what it shares with them and consumes the rest, so a rejected guess or a
new chain costs a roll back, never a recompile.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Iterable, Sequence

import numpy as np

from wire.byte_level import unicode_to_byte
from wire.limits import MAX_GRAMMAR_BYTES
from wire.protocol import Grammar

KINDS = ("json_schema", "json_object", "tool_calls")
# JSON without optional whitespace: what a model may emit is then a function of the values
# alone (flexible whitespace lets a small model pad forever, each newline a legal token)
JSON_OPTIONS = {"whitespace_flexible": False}
# "tool_calls": free text, in which each call is written as the Hermes chat templates (Qwen's)
# ask, between these tags, its JSON valid under the grammar's schema
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_SPECIAL_TEXT = re.compile(rb"<\|[^|]*\|>|\[PAD\d+\]")  # control tokens (<|im_end|>) and unnamed ids


class GrammarError(ValueError):
    """A grammar that cannot be applied: malformed, too large, or refused by the compiler."""


def grammar_problems(grammar: Grammar) -> list[str]:
    """Everything wrong with a Grammar before it is compiled, as sentences a user can act on."""
    if grammar.kind not in KINDS:
        return [f"grammar kind must be one of {', '.join(KINDS)}, got {grammar.kind!r}"]
    found = []
    if len(grammar.schema.encode("utf-8")) > MAX_GRAMMAR_BYTES:
        found.append(f"the schema takes {len(grammar.schema.encode('utf-8')):,} bytes: at most "
                     f"{MAX_GRAMMAR_BYTES:,} are accepted")
    elif grammar.kind in ("json_schema", "tool_calls"):
        try:
            schema = json.loads(grammar.schema)
        except ValueError as exc:
            found.append(f"the schema is not JSON: {exc}")
        else:
            if not isinstance(schema, dict if grammar.kind == "tool_calls" else (dict, bool)):
                found.append("the schema must be a JSON object")
    if grammar.start < 0:
        found.append(f"grammar start must be a position (0 or more), got {grammar.start}")
    return found


def available() -> bool:
    """Whether this machine can apply grammars (llguidance is installed)."""
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


class _Alphabet:
    """Token texts in GPT-2's byte-level alphabet (wire/byte_level.py), read back as bytes."""

    def __init__(self):
        self.byte_of = unicode_to_byte()

    def decode(self, text: bytes) -> bytes:
        if _SPECIAL_TEXT.fullmatch(text):
            return b"\xff" + text
        chars = text.decode("utf-8", "replace")
        if not all(c in self.byte_of for c in chars):  # not byte-level text: never produced under a grammar
            return b"\xff" + text
        return bytes(self.byte_of[c] for c in chars)


def token_bytes(texts: Sequence[bytes]) -> list[bytes]:
    """The bytes each token stands for, from its stored text (GPT-2's byte alphabet, as byte-level
    BPE vocabularies store them: Qwen, Llama 3); a control token and any text outside that
    alphabet get a leading 0xFF, llguidance's mark for a token that is never text."""
    alphabet = _Alphabet()
    return [alphabet.decode(text) for text in texts]


class GrammarVocab:
    """A vocabulary as llguidance sees it: token bytes, a trie over them. Built once per vocabulary
    (0.7 s for 151,936 tokens), shared by every constraint over it."""

    def __init__(self, texts: Sequence[bytes], n_vocab: int | None = None):
        import llguidance

        pieces = token_bytes(texts)
        self.n_vocab = max(n_vocab or 0, len(pieces))
        pieces += [b"\xff[PAD]"] * (self.n_vocab - len(pieces))
        by_bytes: dict[bytes, int] = {}
        for i, piece in enumerate(pieces):
            if piece[:1] != b"\xff":
                by_bytes.setdefault(piece, i)
        # llguidance needs an end token of its own; it is masked out below, and the generation's
        # own end tokens (Generate.stop_ids) allowed once the grammar's value is complete
        # (the lone byte 0xFF is a token too, never in UTF-8 text: a marked token is longer)
        marked = [i for i, piece in enumerate(pieces) if piece[:1] == b"\xff" and len(piece) > 1]
        if not marked:
            raise GrammarError("the vocabulary has no control token to stand for llguidance's end token")
        self.eos = marked[0]
        self._longest = max(len(p) for p in by_bytes) if by_bytes else 1
        self._by_bytes = by_bytes
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped(self, pieces)),
                                                n_vocab=self.n_vocab, eos_token=self.eos)

    def greedy(self, data: bytes) -> list[int]:
        """Longest-match tokenization (what llguidance asks of forced text; never the model's prompt)."""
        out, i = [], 0
        while i < len(data):
            for size in range(min(self._longest, len(data) - i), 0, -1):
                token = self._by_bytes.get(data[i:i + size])
                if token is not None:
                    out.append(token)
                    i += size
                    break
            else:  # a byte no token spells alone: skipped (a byte-level vocabulary has all 256)
                i += 1
        return out


class _Wrapped:
    """What llguidance.TokenizerWrapper reads of a tokenizer."""

    def __init__(self, vocab: GrammarVocab, pieces: list[bytes]):
        self.eos_token_id = vocab.eos
        self.bos_token_id = None
        self.tokens = pieces
        self.special_token_ids = [i for i, piece in enumerate(pieces) if piece[:1] == b"\xff"]
        self._vocab = vocab

    def __call__(self, data: bytes) -> list[int]:
        return self._vocab.greedy(data)


_vocabs: dict[tuple[str, int], GrammarVocab] = {}
_vocabs_lock = threading.Lock()


def vocab_for(key: str, texts: Sequence[bytes] | None = None, n_vocab: int | None = None,
              load=None) -> GrammarVocab:
    """The GrammarVocab of the vocabulary `key` names (its fingerprint), built on first use from
    `texts` or `load()`."""
    with _vocabs_lock:
        found = _vocabs.get((key, n_vocab or 0))
        if found is None:
            found = GrammarVocab(texts if texts is not None else load(), n_vocab)
            _vocabs[(key, n_vocab or 0)] = found
        return found


def grammar_text(grammar: Grammar) -> str:
    """The grammar in llguidance's own form."""
    import llguidance

    schema = json.loads(grammar.schema) if grammar.kind != "json_object" else {"type": "object"}
    try:
        if grammar.kind == "tool_calls":
            return llguidance.grammar_from("lark", tool_calls_lark(schema))
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise GrammarError(f"the schema cannot be compiled: {exc}") from exc


def tool_calls_lark(call_schema: dict) -> str:
    """Free text in which every CALL_OPEN starts a call: its JSON valid under `call_schema`, then
    CALL_CLOSE (a newline allowed on either side, as the templates write it). The text before a
    call is one lexeme that ends at the first CALL_OPEN, and the text after the last call one that
    never contains it: llguidance's lexer is greedy, so where a call starts must be the end of a
    lexeme, never a choice it would have to take back."""
    schema = json.dumps({**call_schema, "x-guidance": JSON_OPTIONS})
    return "\n".join([
        "start: (BEFORE_CALL call)* TEXT",
        f'call: "\\n"? %json {schema} "\\n"? "{CALL_CLOSE}"',
        f"BEFORE_CALL: /(.|\\n)*{CALL_OPEN}/ & ~/(.|\\n)*{CALL_OPEN}(.|\\n)+/",
        f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{CALL_OPEN}(.|\\n)*/",
        ""])


class TokenConstraint:
    """The tokens a grammar allows next, after the tokens it has followed."""

    def __init__(self, grammar: Grammar, vocab: GrammarVocab, end_ids: Iterable[int]):
        import llguidance

        problems = grammar_problems(grammar)
        if problems:
            raise GrammarError("; ".join(problems))
        self.grammar = grammar
        self.vocab = vocab
        self.end_ids = np.asarray(sorted(set(end_ids)), dtype=np.int64)
        self._matcher = llguidance.LLMatcher(vocab.tokenizer, grammar_text(grammar), log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"the schema cannot be compiled: {self._matcher.get_error()}")
        self.followed: list[int] = []  # the tokens consumed, from the grammar's start
        self._bits = np.zeros((vocab.n_vocab + 31) // 32, dtype=np.int32)

    def follow(self, tokens: Sequence[int]) -> bool:
        """Move to the state after `tokens` (made from the start); False, and the state after the
        longest prefix the grammar takes, when a token breaks it (an end token ends the value)."""
        tokens = list(tokens)
        common = len(self.followed)
        if tokens[:common] != self.followed:
            common = 0
            while common < min(len(tokens), len(self.followed)) and tokens[common] == self.followed[common]:
                common += 1
            if common < len(self.followed):
                self._matcher.rollback(len(self.followed) - common)
                del self.followed[common:]
        for token in tokens[common:]:
            if self._matcher.is_stopped() or not self._matcher.consume_token(token):
                if self._matcher.is_error():  # a refused token leaves the matcher broken: start again
                    self._rebuild()
                return False
            self.followed.append(token)
        return True

    def _rebuild(self) -> None:
        import llguidance

        kept = self.followed
        self._matcher = llguidance.LLMatcher(self.vocab.tokenizer, grammar_text(self.grammar), log_level=0)
        self.followed = []
        self._matcher.consume_tokens(kept)
        self.followed = kept

    def forced(self) -> list[int]:
        """The tokens the grammar forces next, before any choice (llguidance's fast-forward tokens:
        the bytes every continuation starts with, tokenized longest-first); empty where a choice
        comes first. A guess, not a certainty: the target may spell the same bytes with other
        tokens, and then the service's pick differs from it."""
        if self._matcher.is_stopped() or self._matcher.is_error():
            return []
        forced = [int(token) for token in self._matcher.compute_ff_tokens()]
        return forced[: forced.index(self.vocab.eos)] if self.vocab.eos in forced else forced  # never its own end

    @property
    def complete(self) -> bool:
        """The tokens followed make a whole value: an end token may come next."""
        return self._matcher.is_accepting()

    def allowed(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) bool: the tokens the grammar takes next, and the end tokens once complete."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), count=min(vocab_size, self._bits.size * 32),
                             bitorder="little").view(bool)
        allowed = bits if bits.size == vocab_size else np.concatenate([bits, np.zeros(vocab_size - bits.size, bool)])
        allowed[self.vocab.eos] = False  # llguidance's own end token: the generation's are below
        if self._matcher.is_accepting():
            allowed[self.end_ids[self.end_ids < vocab_size]] = True
        return allowed

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of logits (V,) with every token the grammar refuses at -inf."""
        return masked_logits(logits, self.allowed(logits.shape[-1]))


def masked_logits(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A copy of logits (V,) that keeps the `allowed` (V,) bool ones, the rest at -inf. Built from the
    allowed ids: a grammar allows few tokens at most steps, and a gather of those costs 0.1 ms on
    151,936 tokens where a select over all of them costs 0.3 to 0.9 ms."""
    kept = np.flatnonzero(allowed[: logits.shape[-1]])
    masked = np.full(logits.shape[-1], -np.inf, dtype=np.float64 if logits.dtype == np.float64 else np.float32)
    masked[kept] = logits[kept]
    return masked
