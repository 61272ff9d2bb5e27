"""How one llama.cpp pass over a KV pool is laid out: as the sessions sent it, or padded into
a single micro-batch when that is cheaper.

Over KV streams of their own (`kv_unified = false`) llama.cpp decodes a batch in micro-batches
("ubatches") of consecutive sequence ids with the same number of tokens each (`split_equal`
with `sequential`, src/llama-batch.cpp). A shared pass of the sessions in slots 0, 2 and 5, or
of blocks of 5 and 3 tokens, is therefore split into several ubatches, and each pays the fixed
cost of a graph run: the weights read from memory once more, every thread barrier of the graph
(on two CPU threads of the tiny test model, 2.4 ms against 0.06 ms a token; on a GPU, the
weight read that sharing a pass was meant to save).

Two kinds of padding make such a pass one ubatch:
- a member's block gets tokens after its last one: its real tokens never attend to them
  (causal mask), their logits are not asked for, and they are removed after the pass;
- an idle stream between two members gets a block of its own that is removed after the pass:
  its cells are its own, and a removed cell is masked to an exact zero in every later sum, as
  after any rejected draft.
Neither changes a bit of a member's logits (tests/remote_verify/test_batch_invariance.py). Both
cost the tokens computed for nothing, so `plan_lengths` pads only when the ubatches it saves
cost more than the tokens it adds, by the prices `DecodeCosts` learns from the passes run.
"""

from __future__ import annotations

from dataclasses import dataclass


def ubatch_count(lengths: dict[int, int], n_ubatch: int) -> int:
    """The ubatches llama.cpp splits a batch into: `lengths` maps each sequence id in the batch
    to its tokens, laid out in ascending id order (as the backend fills a batch)."""
    left = {seq: count for seq, count in sorted(lengths.items()) if count > 0}
    count = 0
    while left:
        run = []
        for seq in left:  # the lowest id with tokens left, then every next id while they are consecutive
            if run and seq != run[-1] + 1:
                break
            run.append(seq)
        per_seq = max(1, min(min(left[seq] for seq in run), n_ubatch // len(run)))
        for seq in run:
            left[seq] -= per_seq
            if left[seq] == 0:
                del left[seq]
        count += 1
    return count


class DecodeCosts:
    """The seconds of a `llama_decode` as a fixed price per ubatch plus a price per token,
    fitted by least squares to the decodes the backend runs, recent ones weighing more.

    Starts from a prior of one ubatch costing as much as one token, in the scale of the first
    decode and worth `PRIOR_WEIGHT` decodes, so a fresh service pads only where that saves
    ubatches at no token cost, and the passes it runs soon decide."""

    DECAY = 0.99  # per decode: the last few hundred decodes make the estimate
    PRIOR_WEIGHT = 2.0

    def __init__(self) -> None:
        # Normal equations of seconds ~ per_ubatch * ubatches + per_token * tokens.
        self._uu = self._ut = self._tt = self._us = self._ts = 0.0
        self._seen = False

    def _add(self, ubatches: float, tokens: float, seconds: float, weight: float) -> None:
        self._uu += weight * ubatches * ubatches
        self._ut += weight * ubatches * tokens
        self._tt += weight * tokens * tokens
        self._us += weight * ubatches * seconds
        self._ts += weight * tokens * seconds

    def observe(self, ubatches: int, tokens: int, seconds: float) -> None:
        if not self._seen:  # the prior, priced like this first decode: 1 ubatch = 1 token
            self._seen = True
            price = seconds / (ubatches + tokens)
            for prior_tokens in (1, 3):
                self._add(1, prior_tokens, price * (1 + prior_tokens), self.PRIOR_WEIGHT / 2)
        for name in ("_uu", "_ut", "_tt", "_us", "_ts"):
            setattr(self, name, getattr(self, name) * self.DECAY)
        self._add(ubatches, tokens, seconds, 1.0)

    @property
    def prices(self) -> tuple[float, float]:
        """(seconds per ubatch, seconds per token), neither below zero; (1, 1) before any decode."""
        if not self._seen:
            return 1.0, 1.0
        det = self._uu * self._tt - self._ut * self._ut
        if det <= 1e-12 * max(self._uu * self._tt, 1e-300):  # every decode alike: no split to read
            per_token = (self._us + self._ts) / max(self._ut + self._tt, 1e-300)
            return per_token, per_token
        per_ubatch = (self._us * self._tt - self._ts * self._ut) / det
        per_token = (self._uu * self._ts - self._ut * self._us) / det
        return max(per_ubatch, 0.0), max(per_token, 0.0)


@dataclass(frozen=True)
class PassLayout:
    """Tokens each sequence gets in the pass (members: their block, perhaps padded; fills: a
    block thrown away), and the ubatches llama.cpp will run it in."""

    lengths: dict[int, int]
    ubatches: int

    def padding(self, real: dict[int, int]) -> int:
        return sum(self.lengths.values()) - sum(real.values())


def plan_lengths(real: dict[int, int], room: dict[int, int], per_ubatch: float, per_token: float,
                 n_ubatch: int) -> PassLayout:
    """The cheapest layout of a pass: `real` maps each member's sequence id to its block's
    tokens; `room` maps every sequence id of the pool to the tokens its stream can take. Candidates: as sent; every block padded to the longest;
    padded, and every idle stream between the lowest and highest member filled (one ubatch)."""

    def layout(lengths: dict[int, int]) -> PassLayout:
        return PassLayout(lengths, ubatch_count(lengths, n_ubatch))

    candidates = [layout(dict(real))]
    longest = max(real.values())
    if len(real) > 1 and longest * len(real) <= n_ubatch and all(room.get(seq, 0) >= longest for seq in real):
        padded = {seq: longest for seq in real}
        candidates.append(layout(padded))
        span = range(min(real), max(real) + 1)
        if longest * len(span) <= n_ubatch and all(seq in real or room.get(seq, 0) >= longest for seq in span):
            candidates.append(layout({seq: longest for seq in span}))

    def cost(candidate: PassLayout) -> float:
        return per_ubatch * candidate.ubatches + per_token * sum(candidate.lengths.values())

    return min(candidates, key=cost)  # the first, as sent, wins a tie
