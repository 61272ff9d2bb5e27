"""The specwire wire protocol: typed, tagged msgpack messages and the vocabulary fingerprint.

Version 1 travels in the WebSocket subprotocol name. Fields are only ever appended, with
defaults, so an older peer still decodes a newer message. Both ends build their decoder
once (`decode_client_message`, `decode_server_message`).

A session, as the client sees it:
    Hello     -> Welcome            (or Error, fatal, and the socket closes)
    Verify    -> Verdict            (one per round, sequence numbers 1, 2, 3, ...)
    Sync      -> Synced             (rebuild the committed history after an Error)
    Generate  -> Generated ...      (the target streams, one frame per forward pass, the
                                     last with done=True; Cancel ends it early)
    Draft     (no reply)            (during a stream: the client's guesses for the positions
                                     ahead; the service's next passes verify them)

A streamed pass commits one token of the target's own, after the draft tokens it accepted:
`Generated.accepted` of its tokens were the client's (local_draft/stream_speculator.py,
remote_verify/stream_drafts.py).
"""

from __future__ import annotations

import hashlib
from typing import Sequence, Union

import msgspec

SUBPROTOCOL = "specwire.v1"
PROTOCOL_VERSION = 1

# Close codes (4000-4999 are free for applications).
CLOSE_PROTOCOL_ERROR = 4400
CLOSE_VOCAB_MISMATCH = 4409
CLOSE_IDLE_TIMEOUT = 4408  # neither side sent anything for too long; reconnect and Sync
CLOSE_GOING_AWAY = 1001  # the service is shutting down; reconnect (any replica will do)


# The lowest temperature that samples. Below it, logits / temperature leave float64's range
# for real logits (1e-310 gives inf, then NaN probabilities), and well before that the
# distribution is the argmax: at 1e-3 a runner-up 0.02 logits behind keeps e**-20 of the
# mass. So (0, MIN_TEMPERATURE) is refused with a pointer to 0 (greedy), not rounded to it.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """How tokens are chosen; one frozen object passed everywhere.

    temperature 0 means greedy (argmax); a sampling temperature is at least MIN_TEMPERATURE.
    top_k 0 and top_p 1.0 mean "no truncation".
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def problems(self) -> list[str]:
        """Everything wrong with these parameters, as sentences a user can act on."""
        found = []
        if not (self.temperature >= 0.0) or self.temperature > MAX_TEMPERATURE:
            found.append(f"temperature must be between 0 and {MAX_TEMPERATURE:g}, got {self.temperature}")
        elif 0.0 < self.temperature < MIN_TEMPERATURE:
            found.append(f"temperature {self.temperature:g} is below the lowest sampling temperature, "
                         f"{MIN_TEMPERATURE:g}: use 0 for greedy decoding")
        if self.top_k < 0:
            found.append(f"top_k must be 0 (off) or a positive count, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            found.append(f"top_p must be in (0, 1], got {self.top_p}")
        return found

    def checked(self) -> SamplingParams:
        """These parameters, or a ValueError listing everything wrong with them."""
        found = self.problems()
        if found:
            raise ValueError("; ".join(found))
        return self


class SparseDist(msgspec.Struct, array_like=True):
    """A draft distribution truncated to a few tokens: q(ids[i]) = probs[i], zero elsewhere."""

    ids: list[int]
    probs: list[float]


# ---- client -> service ------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello"):
    """First message of a session: who the drafter is and how it samples."""

    vocab_fingerprint: str
    vocab_size: int
    bos_id: int
    eos_id: int
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None  # keys the service's decisions (wire/randomness.py); None: its own fresh seed
    client: str = ""


class Verify(msgspec.Struct, tag="verify"):
    """One round: extend the committed history, then verify a block of draft tokens.

    `committed_len` is the history length the client believes the service holds before
    `append` is added; `append` carries tokens the service has not seen (a prompt, a new
    user turn). An empty `draft` asks the service for one token of its own (k = 0).
    `draft_dists[i]` is the distribution `draft[i]` was sampled from (empty when greedy).
    """

    seq: int
    committed_len: int
    append: list[int] = []
    draft: list[int] = []
    draft_dists: list[SparseDist] = []
    draft_source: str = ""  # who drafted: "model" (the GGUF drafter), "ngram" (copied context), "": unstated


class Sync(msgspec.Struct, tag="sync"):
    """Replace the service's committed history with the client's (after an error or reconnect).

    `seed`, when set, re-keys the session's random decisions from here on, as a Hello with
    that seed would (wire/randomness.py): a client running many independent generations on
    one session (a benchmark, a test of the output distribution) gives each its own seed.
    """

    seq: int
    tokens: list[int]
    seed: int | None = None


class Grammar(msgspec.Struct, frozen=True):
    """A constraint on the tokens a generation may make (wire/grammar.py compiles it).

    `kind` "json_schema": the output is one JSON value valid under `schema` (JSON text);
    "json_object": any JSON object (`schema` unused); "tool_calls": free text in which each
    call, written between `<tool_call>` and `</tool_call>` as Hermes chat templates ask, is JSON
    valid under `schema` (wire/grammar.py). The tokens from absolute position
    `start` on are constrained: a stream resumed after a lost connection says where the
    constrained reply began, and the tokens already made since are checked against it.
    """

    kind: str
    schema: str = ""
    start: int = 0


class Generate(msgspec.Struct, tag="generate"):
    """Server-only decoding: extend the history by `append`, then let the target continue alone.

    The service streams one Generated frame per token until `max_tokens`, a token in
    `stop_ids` (sent, then the stream ends), a full context, or a Cancel. For clients with
    no drafter, and as the baseline speculation is measured against.
    """

    seq: int
    committed_len: int
    append: list[int] = []
    max_tokens: int = 128
    stop_ids: list[int] = []
    # None: the target's own distribution; else only tokens the grammar allows (a stop token
    # once the grammar's value is complete), applied to the target's logits before anything
    # else, so the stream is the constrained target's whatever was guessed
    grammar: Grammar | None = None
    # -1: no log probabilities; n >= 0: each Generated token's, and the n most likely (MAX_TOP_LOGPROBS)
    logprobs: int = -1
    # -1: continue the whole committed history. k >= 0 (a service whose Welcome lists "rewind"):
    # the new history shares only the first k of the `committed_len` tokens the service holds;
    # it keeps those (and their cache) and appends `append`, as a Sync of the new history would,
    # without the Sync's round trip before a new conversation's first token
    keep: int = -1
    # None: the session's random decisions go on as keyed; else re-keyed from here on, as Sync's seed
    seed: int | None = None


class Draft(msgspec.Struct, tag="draft"):
    """During the stream started by Generate `seq`: the client's guesses for the tokens at
    positions start, start + 1, ... (absolute positions in the history).

    A chain of guesses is numbered by the client. The first Draft of a chain starts where the
    client's received history ends: its guesses continue that history. A later Draft of the
    same chain continues it from `start` on, replacing what earlier ones said about those
    positions. The service checks the guesses for positions it has already committed against
    what it committed (a chain that differs there is dropped: it guessed after another
    text), and verifies the rest in its next pass:
    each guess it keeps is the token the target itself chose there, greedy or sampled
    (wire/sampling.py `race_choice`), so drafts change how fast the stream goes, never what
    it says. No reply: the Generated frames say what was accepted.

    A Draft may carry a tree instead of a chain (`parents`, wire/draft_tree.py): node i
    guesses the token after node parents[i] (-1: after the token at start - 1), nodes at
    depth d are guesses for position start + d - 1, and the pass keeps, at each node, the
    child that equals the target's pick. A tree is not continued: a later Draft, tree or
    chain, replaces it. A service whose Welcome says `trees` is false verifies the tree's
    first-choice path (the chain of first children) only.
    """

    seq: int
    chain: int
    start: int
    tokens: list[int]
    source: str = ""  # who drafted: "model", "ngram"
    parents: list[int] = []  # each token's parent node (-1: the token before the tree); empty: a chain


class Cancel(msgspec.Struct, tag="cancel"):
    """Stop the generation started by Generate `seq`; its stream ends with done=True."""

    seq: int


ClientMessage = Union[Hello, Verify, Sync, Generate, Draft, Cancel]


# ---- service -> client ------------------------------------------------------------------


class PassCost(msgspec.Struct, array_like=True):
    """What a forward pass of `tokens` tokens (one session's, from a short context) costs the
    service's device, in milliseconds, as it measured them (remote_verify/pass_costs.py)."""

    tokens: int
    ms: float


class Welcome(msgspec.Struct, tag="welcome"):
    """The service accepts the session and states its limits."""

    session_id: str
    max_context: int
    max_draft: int
    vocab_size: int
    target: str = ""
    capabilities: list[str] = []
    protocol: int = PROTOCOL_VERSION
    max_frame_bytes: int = 0  # 0: not stated
    idle_timeout_s: float = 0.0  # a session silent this long, both ways, is closed (0: not stated)
    pass_costs: list[PassCost] = []  # the device's cost curve c(n), a few sizes (empty: not stated)
    trees: bool = False  # a Draft's tree is verified with tree attention (false: its first-choice path only)
    grammars: list[str] = []  # the Grammar kinds a Generate may carry (empty: none; an older service)


class Verdict(msgspec.Struct, tag="verdict"):
    """The answer to a Verify: `accepted` draft tokens are kept, then `token` is appended.

    `token` is the target's correction at the first rejected position, or the bonus token
    when every draft token was accepted. `committed_len` is the history length after both.
    """

    seq: int
    accepted: int
    token: int
    committed_len: int
    forward_s: float = 0.0  # the target's forward pass for this round
    accept_s: float = 0.0  # the acceptance step
    queue_s: float = 0.0  # from the frame's arrival to the start of its forward pass


class Synced(msgspec.Struct, tag="synced"):
    seq: int
    committed_len: int


class Error(msgspec.Struct, tag="error"):
    """A refusal. `fatal` errors close the session; others ask the client to Sync and retry."""

    code: str
    message: str
    seq: int = 0
    fatal: bool = False
    retry_after_s: float = 0.0  # > 0: the request was not run; send it again after this long


class TokenLogprobs(msgspec.Struct, array_like=True):
    """The target's log probability of a committed token, and of the most likely tokens there:
    the log-softmax of its logits (after a grammar's mask; before temperature, top-k and top-p)."""

    logprob: float
    top_ids: list[int] = []
    top_logprobs: list[float] = []


class Generated(msgspec.Struct, tag="generated"):
    """Tokens of a streamed generation, one frame per forward pass; `done` marks the last frame."""

    seq: int
    tokens: list[int]
    committed_len: int
    done: bool = False
    stop_reason: str = ""  # on the last frame: "eos", "max_tokens", "context" or "cancelled"
    forward_s: float = 0.0  # the forward passes behind these tokens
    queue_s: float = 0.0  # waiting for the device behind other sessions' work
    accepted: int = 0  # the first `accepted` tokens were the client's draft tokens (Draft), verified
    drafted: int = 0  # draft tokens the pass verified (accepted or not)
    pass_tokens: int = 0  # tokens the whole pass ran, every session's (0: not stated)
    pass_sessions: int = 0  # sessions that shared the pass (0: not stated)
    logprobs: list[TokenLogprobs] = []  # one per token, when the Generate asked (whoever guessed the token)


ServerMessage = Union[Welcome, Verdict, Synced, Error, Generated]

_encoder = msgspec.msgpack.Encoder()
_client_decoder = msgspec.msgpack.Decoder(ClientMessage)
_server_decoder = msgspec.msgpack.Decoder(ServerMessage)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_client_message(frame: bytes) -> ClientMessage:
    """Decode a client frame; raises msgspec.DecodeError / ValidationError on bad input."""
    return _client_decoder.decode(frame)


def decode_server_message(frame: bytes) -> ServerMessage:
    return _server_decoder.decode(frame)


def vocab_fingerprint(token_texts: Sequence[bytes]) -> str:
    """A hash of every token's text in id order: equal fingerprints mean one vocabulary.

    Each text is length-prefixed so that no two different vocabularies can collide by
    shifting bytes between neighbouring tokens.
    """
    digest = hashlib.sha256()
    for text in token_texts:
        digest.update(len(text).to_bytes(4, "little"))
        digest.update(text)
    return digest.hexdigest()[:32]
