"""The draft model: a GGUF file run by llama.cpp, proposing blocks of tokens.

This is the only module of the client that imports llama_cpp (after `prepare_llama_cpp`,
which must come first: wire/llama_switches.py). The model keeps a KV cache of the tokens
it has evaluated; `propose` first catches the cache up with the committed history (reusing
the longest common prefix, so a rejection costs a roll back, not a recompute), then
drafts k tokens one at a time. A tree of guesses (the default mode, where the service verifies
trees) grows a level at a time: `branch_guesses` decodes the last token of every branch in one
llama.cpp batch, each branch a sequence of its own in the cache (copied from its parent's cells,
which it shares), and `batch_cost` measures what a batch of b branches costs against one.
"""

from __future__ import annotations

import ctypes
import logging
import time
from pathlib import Path
from typing import Callable, Sequence

from wire.llama_switches import prepare_llama_cpp
from wire.threads import DRAFT_THREADS

prepare_llama_cpp()  # before llama.cpp loads: switches it reads once per process

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402
from llama_cpp._utils import suppress_stdout_stderr  # noqa: E402

from wire.protocol import Hello, SamplingParams, SparseDist, vocab_fingerprint  # noqa: E402
from wire.grammar import masked_logits  # noqa: E402
from wire.sampling import race_choice_sparse, sample, truncate, warp  # noqa: E402

log = logging.getLogger(__name__)

WIRE_TOP_K_CAP = 64  # draft distributions travel as their 64 most likely tokens at most
# A catch-up that may be cut short (while a verdict is in flight) runs in pieces this long,
# so that a prompt's prefill delays the verdict by at most one piece: on one core of this
# project's CPU, the 0.5B drafter takes 51 ms for 2 tokens (26 ms each) and 152 ms for 8
# (19 ms each), and the verdict of a one-token step comes after 60.
CATCH_UP_PIECE = 2
# Sequences a level of a tree decodes together, besides the text's own (sequence 0): llama.cpp
# PR #8215 measures 8 branches for 1.6x one on an RTX 4090; wider levels add little there.
MAX_BRANCHES = 8
# A re-rooted tree's level decodes at most this many committed tokens the branches had not decoded
# (the stream passed their open leaves); more are read by a catch-up (the text moved far: a Sync).
MAX_FRESH_TOKENS = 64
BATCH_COST_WIDTHS = (1, 2, 4, 8)  # widths batch_cost measures (the stream controller picks among them)
BATCH_COST_REPEATS = 3  # each width's cost is the least of this many decodes (a busy machine only adds time)
# candidates returned per branch: its first choice and the alternatives after it (draft_tree.py keeps
# those above ALTERNATE_ABOVE); in prose the target's token is the default pair's drafter's fourth to
# eighth at 8% of positions, where it is none of the first three at 15 to 19%
BRANCH_CHOICES = 8
# Sampled, a candidate's chance of being the target's pick is read from the race, not from the
# drafter's probability: both ends race the same clocks, the target over its own distribution, so
# the target's first to arrive differs from the drafter's only as far as the two distributions
# differ, and that is likeliest where the drafter's race was close. Taking the log-ratio of the two
# distributions at a token as noise of scale RACE_SPREAD / T (Gumbel: log-probabilities scale as 1/T),
# a candidate whose clock arrives at t (its clock over its probability) is the target's pick with
# chance proportional to t ** -(T / RACE_SPREAD). Fitted on the default pair's T 0.7 recording
# (`python -m benchmarks.race_chance`, 2,222 positions): its log-likelihood of the target's picks -975
# against -1,217 for the drafter's probabilities (spreads 0.5 and 1.2: -1,061, -1,043), and calibrated
# where those are not (where the race gives its winner 0.4 to 0.6, it is right at 0.50; where the
# drafter's probability of it is below 0.2, at 0.40). On the emulated 70B at 14 ms the default mode's
# trees then made 1.30x chains at T 0.7, against 1.20x by the drafter's probabilities. Only T 0.7 was
# fitted: other temperatures take the 1/T scaling on trust.
RACE_SPREAD = 0.84



def committed_reach(path: Sequence[int], committed: Sequence[int]) -> int:
    """How many of the committed tokens, but the newest (whose logits the next guesses need, so it is
    decoded again), a branch that decoded `path` holds: their common prefix."""
    limit = min(len(path), len(committed) - 1)
    return next((i for i in range(limit) if path[i] != committed[i]), limit)


class DraftModelError(RuntimeError):
    """The draft model cannot be loaded or cannot go on (file missing, context full)."""


class DraftModel:
    def __init__(self, path: str | Path, n_ctx: int = 4096, gpu_layers: int = -1,
                 n_threads: int | None = None, vocab_only: bool = False):
        path = Path(path)
        if not path.is_file():
            raise DraftModelError(f"draft model not found: {path}")
        self.n_threads = n_threads or DRAFT_THREADS  # the thread plan: wire/threads.py
        try:
            # llama.cpp warns on stderr that a vocabulary-only model's training context (0) is short
            with suppress_stdout_stderr(disable=not vocab_only):
                self._llama = llama_cpp.Llama(
                    model_path=str(path),
                    n_ctx=n_ctx,
                    n_batch=512,
                    n_gpu_layers=gpu_layers,  # -1: every layer on the GPU when llama.cpp has one
                    # batches (catching up after a round) too: llama-cpp-python's own default for
                    # them is every core of the machine, which fights the service for them
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads,
                    logits_all=False,  # logits are read for the last position only
                    vocab_only=vocab_only,  # tokenizer only: for clients that let the service generate
                    verbose=False,
                )
            if not vocab_only:
                self._allow_branches()
        except (ValueError, RuntimeError) as exc:
            raise DraftModelError(f"llama.cpp could not load {path}: {exc}") from exc
        self.path = path
        self.n_ctx = n_ctx
        self._vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        self.vocab_size = self._llama.n_vocab()
        self._logits_row = ctypes.c_float * self.vocab_size  # a row of llama.cpp's logits, read by address
        self.bos_id = self._llama.token_bos()
        self.eos_id = self._llama.token_eos()
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload()) and gpu_layers != 0
        self._fingerprint: str | None = None
        self.last_catch_up = 0  # tokens the last propose() had to evaluate before drafting
        self.piece_s = 0.0  # how long a piece of an interruptible catch-up takes (recent mean; 0: not seen)
        self._end_ids: frozenset[int] | None = None
        self._branch_seq: dict[tuple[int, ...], int] = {}  # a branch's guesses after _branch_base -> its sequence
        self._branch_base: list[int] | None = None  # the text the branches continue (None: no branches cached)
        self._root_logits: np.ndarray | None = None  # the logits after _branch_base
        self._batch_cost: dict[int, float] | None = None
        log.info("draft model %s: vocab %d, gpu offload %s", path.name, self.vocab_size, self.gpu_offload)

    # ---- vocabulary -----------------------------------------------------------------

    def token_text(self, token_id: int) -> bytes:
        """The token's stored text (not its detokenized bytes): what the fingerprint hashes."""
        return llama_cpp.llama_vocab_get_text(self._vocab, token_id) or b""

    @property
    def vocab_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint([self.token_text(i) for i in range(self.vocab_size)])
        return self._fingerprint

    @property
    def chat_template(self) -> str | None:
        return self._llama.metadata.get("tokenizer.chat_template")

    @property
    def end_ids(self) -> frozenset[int]:
        """Every token that ends a generation: EOS, and its kin (Qwen's <|endoftext|> next to <|im_end|>)."""
        if self._end_ids is None:
            self._end_ids = frozenset(
                i for i in range(self.vocab_size) if llama_cpp.llama_vocab_is_eog(self._vocab, i)) | {self.eos_id}
        return self._end_ids

    def hello(self, params: SamplingParams, seed: int | None = None, client: str = "") -> Hello:
        """The handshake that tells a service this drafter's vocabulary and how it samples."""
        return Hello(vocab_fingerprint=self.vocab_fingerprint, vocab_size=self.vocab_size, bos_id=self.bos_id,
                     eos_id=self.eos_id, sampling=params, seed=seed, client=client)

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        add_bos = self.add_bos if add_bos is None else add_bos
        return self._llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for in output text (control tokens give none)."""
        return self._llama.detokenize([token_id], special=False)

    # ---- drafting -------------------------------------------------------------------

    @property
    def evaluated(self) -> list[int]:
        """Tokens whose keys and values are in the cache, in order."""
        return self._llama.input_ids[: self._llama.n_tokens].tolist()

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator, cap: int | None = WIRE_TOP_K_CAP,
                should_stop: Callable[[], bool] | None = None,
                allowed: np.ndarray | None = None) -> tuple[list[int], list[SparseDist]]:
        """Draft k tokens after `context`; returns them and (when sampling) their distributions.

        Sampling draws from the warped draft distribution truncated to `cap` tokens, and
        returns exactly that distribution, so the service can apply min(1, p/q).
        `should_stop` is asked before each token: drafting ahead ends when a verdict arrives.
        `allowed` (V,) bool: the only tokens the first may be (a grammar's mask: k is then 1).
        """
        assert allowed is None or k == 1, "a grammar's mask holds for one position"
        self._check_room(context, k)
        self._catch_up(context)
        return self._draft(k, params, rng, cap, should_stop, allowed)

    def guess(self, context: Sequence[int], params: SamplingParams, clocks: np.ndarray | None,
              allowed: np.ndarray | None = None) -> int:
        """The draft's guess at the target's token after `context`, in a stream: its argmax
        (greedy), or the winner of the race of its own distribution (truncated as on the wire)
        over `clocks`, the race's clocks at that position (wire/sampling.py `race_choice`), which
        picks the target's token as often as the two distributions allow. The cache then holds
        `context`, so the next guess evaluates one token. `allowed` (V,) bool: a grammar's mask,
        applied to the logits first, as the service applies it to the target's."""
        self._check_room(context, 1)
        self._catch_up(context)
        logits = _masked(self._last_logits(), allowed)
        if params.greedy:
            return int(np.argmax(logits))
        return race_choice_sparse(truncate(warp(logits, params), WIRE_TOP_K_CAP), clocks)

    def draft_ahead(self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator,
                    should_stop: Callable[[], bool]) -> tuple[int | None, list[int], list[SparseDist]]:
        """Guess the token after `context` (the draft's argmax), then draft up to k tokens after it.

        Used while a verdict is in flight: the guess stands for the service's bonus token,
        and the block after it is used only if the guess turns out right. Returns
        (guess, tokens, dists); fewer than k tokens when `should_stop` ended it early, and no
        guess (None) when it ended before the cache held `context` (a long prompt's prefill).
        """
        self._check_room(context, k + 1)
        if not self._catch_up(context, should_stop):
            return None, [], []
        guess = int(np.argmax(self._last_logits()))
        if k == 0 or guess in self.end_ids or should_stop():
            return guess, [], []
        self._llama.eval([guess])
        tokens, dists = self._draft(k, params, rng, WIRE_TOP_K_CAP, should_stop)
        return guess, tokens, dists

    def _draft(self, k: int, params: SamplingParams, rng: np.random.Generator, cap: int | None,
               should_stop: Callable[[], bool] | None,
               allowed: np.ndarray | None = None) -> tuple[list[int], list[SparseDist]]:
        """Draft up to k tokens after the cache's last position; the last one is not evaluated."""
        tokens: list[int] = []
        dists: list[SparseDist] = []
        for i in range(k):
            if i and should_stop is not None and should_stop():
                break
            if i:
                self._llama.eval([tokens[-1]])
            logits = _masked(self._last_logits(), allowed if i == 0 else None)
            if params.greedy:
                token = int(np.argmax(logits))
            else:
                probs = warp(logits, params)
                dist = truncate(probs, cap or self.vocab_size)
                token = sample(dist, rng)
                dists.append(dist)
            tokens.append(token)
        return tokens, dists

    # ---- trees of guesses -----------------------------------------------------------

    def _allow_branches(self) -> None:
        """Recreate the context with room for MAX_BRANCHES sequences beside the text's, in one
        unified cache (a branch shares its ancestors' cells). llama-cpp-python's Llama makes a
        context of one sequence and takes no setting for more, so its own context is swapped for
        one made with the same settings and these two changed, before anything is evaluated."""
        from llama_cpp import _internals

        llama = self._llama
        params = llama.context_params
        params.n_seq_max = MAX_BRANCHES + 1
        params.kv_unified = True  # every sequence sees the shared prefix's cells, and n_ctx is the whole cache
        old = llama._ctx
        llama._ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        old.close()
        # a token may belong to every branch at once: the text's newest token, decoded in the level's
        # batch for the text and for each of its new children (`_reroot`)
        self._batch = llama_cpp.llama_batch_init(llama.n_batch, 0, MAX_BRANCHES + 1)

    def close(self) -> None:
        """Free the batch of branches (the model and context go with the Llama object)."""
        batch, self._batch = getattr(self, "_batch", None), None
        if batch is not None and llama_cpp is not None and getattr(llama_cpp, "llama_batch_free", None):
            llama_cpp.llama_batch_free(batch)  # (at interpreter exit the module may be gone already)

    def __del__(self) -> None:
        self.close()

    def branch_guesses(self, context: Sequence[int], paths: Sequence[Sequence[int]], params: SamplingParams,
                       clocks_for: Callable[[int], np.ndarray | None]) -> list[list[tuple[int, float]]]:
        """For each branch (guesses after `context`; the empty one: `context` itself), the drafter's
        candidates for the token after it, best first, with its probability of each: by probability
        (greedy), or in the order of the race over the clocks at that position (`clocks_for(position)`),
        whose first is the guess a chain would make there. The branches' last tokens are decoded
        together, one batch of sequences; a branch whose parent is cached decodes one token."""
        longest = max((len(path) for path in paths), default=0)
        self._check_room(context, longest + 1)
        fresh: list[int] = []  # the text's last tokens, decoded in the level's batch (a re-rooted tree)
        if self._branch_base != list(context) or self._llama.n_tokens != len(context):
            fresh = self._reroot(context)
            if fresh is None:
                fresh = []
                self._catch_up(context)
                self._branch_base = list(context)
                self._root_logits = self._last_logits()
        try:
            rows = self._decode_branches(len(context), [tuple(path) for path in paths], fresh)
        except DraftModelError:
            if fresh:  # the text's cells end before them: the next catch-up reads them
                self.rollback(len(context) - len(fresh))
                self._drop_branches()
            raise
        out = []
        for path, row in zip(paths, rows):
            logits = self._root_logits if row is None else self._logits_at(row)
            out.append(_candidates(logits, params, clocks_for(len(context) + len(path))))
        return out

    def _reroot(self, context: Sequence[int]) -> list[int] | None:
        """Move the branches' root down to `context`, the text they continued and the tokens the stream
        committed after it; returns the committed tokens the next level's batch must decode for the text
        (None: it cannot, and a catch-up reads the text, every branch then decoded whole again).

        The text (sequence 0) takes the cells of the longest committed prefix some branch decoded; the
        rest (at least the newest token, whose logits the text's guesses need) goes first in the level's
        batch, for the text and for each of its new branches at once; the branches below the committed
        tokens keep their sequences, re-keyed, and the others are freed. A frame used to cost a
        catch-up's decode, then the whole subtree again in the level's batch."""
        base = self._branch_base
        if base is None or len(context) <= len(base) or self._llama.n_tokens != len(base) \
                or list(context[:len(base)]) != base:
            return None
        committed = tuple(int(token) for token in context[len(base):])
        k = len(committed)
        reach, source = 0, 0  # the longest committed prefix (but the newest) a branch holds, and its sequence
        for path, seq in self._branch_seq.items():
            common = committed_reach(path, committed)
            if common > reach:
                reach, source = common, seq
        if k - reach > MAX_FRESH_TOKENS:
            return None
        kept = {path[k:]: seq for path, seq in self._branch_seq.items() if len(path) > k and path[:k] == committed}
        mem = llama_cpp.llama_get_memory(self._llama.ctx)
        if reach:
            llama_cpp.llama_memory_seq_cp(mem, source, 0, len(base), len(base) + reach)
        for seq in set(self._branch_seq.values()) - set(kept.values()):
            llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
        self._branch_seq = kept
        self._llama.input_ids[len(base):len(context)] = committed
        self._llama.n_tokens = len(context)  # the rest is decoded next (branch_guesses undoes this if it fails)
        self._branch_base, self._root_logits = list(context), None
        return list(committed[reach:])

    def _decode_branches(self, base: int, paths: list[tuple[int, ...]], fresh: Sequence[int] = ()) -> list[int | None]:
        """Decode what each branch's sequence lacks, all in one batch; returns each path's row of
        logits (None: the empty path, whose logits are the text's own). `fresh`: the text's last tokens
        (up to base - 1), not decoded yet: they go first in the batch, for the text and for each branch
        that starts at the text, and the last one's logits become the text's (`_reroot`)."""
        mem = llama_cpp.llama_get_memory(self._llama.ctx)
        wanted = {path[:i] for path in paths for i in range(len(path))}
        for path in [p for p in self._branch_seq if p not in wanted]:  # branches not grown now: free them
            llama_cpp.llama_memory_seq_rm(mem, self._branch_seq.pop(path), -1, -1)
        free = sorted(set(range(1, MAX_BRANCHES + 1)) - set(self._branch_seq.values()))
        batch, rows, taken = self._batch, [], {}  # taken: a parent whose sequence its first child took over
        batch.n_tokens = 0
        for i, token in enumerate(fresh):  # their sequences are filled in as the text's new branches get theirs
            batch.token[i], batch.pos[i], batch.logits[i] = token, base - len(fresh) + i, i == len(fresh) - 1
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
        batch.n_tokens = len(fresh)
        for path in paths:
            if not path:
                rows.append(None)
                continue
            cached = max(i for i in range(len(path)) if i == 0 or path[:i] in self._branch_seq or path[:i] in taken)
            parent = path[:cached]
            if parent and parent not in taken:  # the first child continues its parent's sequence
                seq = taken[parent] = self._branch_seq.pop(parent)
            else:  # the text's first guesses, and a parent's later children: a sequence of their own
                if not free:
                    raise DraftModelError(f"a level of more than {MAX_BRANCHES} branches")
                seq = free.pop(0)
                llama_cpp.llama_memory_seq_cp(mem, taken[parent] if parent else 0, seq, 0, base + len(parent))
                if not parent:  # the text's fresh tokens are this branch's too
                    for i in range(len(fresh)):
                        batch.seq_id[i][batch.n_seq_id[i]] = seq
                        batch.n_seq_id[i] += 1
            for i in range(cached, len(path)):
                j = batch.n_tokens
                batch.token[j] = path[i]
                batch.pos[j] = base + i
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
                batch.logits[j] = i == len(path) - 1
                batch.n_tokens += 1
            self._branch_seq[path] = seq
            rows.append(batch.n_tokens - 1)
        if batch.n_tokens and llama_cpp.llama_decode(self._llama.ctx, batch) != 0:
            raise DraftModelError("llama.cpp could not decode a level of branches (is the cache full?)")
        if fresh:
            self._root_logits = self._logits_at(len(fresh) - 1)
        return rows

    def _drop_branches(self) -> None:
        mem = llama_cpp.llama_get_memory(self._llama.ctx)
        for seq in self._branch_seq.values():
            llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
        self._branch_seq.clear()
        self._branch_base = None

    def batch_cost(self, context: Sequence[int]) -> dict[int, float]:
        """What decoding b branches one token each costs against one branch, for b in
        BATCH_COST_WIDTHS (measured once, after `context`, the least of a few decodes each): the
        drafter's price of a tree's width, which the stream controller weighs against the
        service's."""
        if self._batch_cost is None:
            seconds = {}
            for width in BATCH_COST_WIDTHS:
                best = float("inf")
                for _ in range(BATCH_COST_REPEATS):
                    self._drop_branches()
                    self._catch_up(context)
                    self._branch_base, self._root_logits = list(context), None
                    paths = [((int(context[-1]) + i) % self.vocab_size,) for i in range(width)]  # any tokens: only the time counts
                    began = time.perf_counter()
                    self._decode_branches(len(context), paths)
                    best = min(best, time.perf_counter() - began)
                seconds[width] = best
                self._drop_branches()
            self._batch_cost = {width: seconds[width] / seconds[1] for width in seconds}
            log.info("draft batch cost (b branches over one): %s",
                     ", ".join(f"{b}: {x:.2f}" for b, x in self._batch_cost.items()))
        return self._batch_cost

    def _logits_at(self, row: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(self._llama.ctx, row)
        # by address: np.ctypeslib.as_array builds an array interface on every call (9 us against 3)
        return np.frombuffer(self._logits_row.from_address(ctypes.addressof(pointer.contents)), np.float32).copy()

    def _check_room(self, context: Sequence[int], k: int) -> None:
        if len(context) + k > self.n_ctx:
            raise DraftModelError(
                f"context full: {len(context)} tokens + {k} drafted exceeds the draft context of {self.n_ctx}")

    def lag(self, context: Sequence[int]) -> int:
        """How many tokens of `context` a catch-up would evaluate now."""
        # asked every adaptive round, over the whole context: compared in numpy, not token by token
        limit = min(self._llama.n_tokens, len(context))
        differ = np.flatnonzero(self._llama.input_ids[:limit] != np.asarray(context[:limit]))
        common = int(differ[0]) if differ.size else limit
        return len(context) - min(common, len(context) - 1)

    def keep_up(self, context: Sequence[int], should_stop: Callable[[], bool] | None = None) -> None:
        """Evaluate what of `context` the cache lacks, so a later block starts without a catch-up.

        For rounds that draft nothing: run while their verdict is in flight, it costs no
        waiting, whereas the catch-up of many such rounds before the next block is time the
        user waits for. `should_stop` may end it early; what was evaluated stays cached.
        """
        self._check_room(context, 0)
        self._catch_up(context, should_stop)

    def rollback(self, n_keep: int) -> None:
        """Forget every cached position from n_keep on (the next eval overwrites them)."""
        self._llama.n_tokens = min(n_keep, self._llama.n_tokens)

    def _catch_up(self, context: Sequence[int], should_stop: Callable[[], bool] | None = None) -> bool:
        """Make the cache hold exactly `context`, evaluating at least its last token.

        With `should_stop`, evaluates in pieces and returns False as soon as it says stop
        (the cache then holds a prefix of `context`, which the next catch-up reuses)."""
        if not context:
            raise DraftModelError("empty context: drafting needs at least one token (the prompt or BOS)")
        if self._branch_seq or self._branch_base is not None:
            self._drop_branches()  # the text moves: branches continue another text
        common = len(context) - self.lag(context)  # the last token is re-run for its logits
        self.rollback(common)
        pending = list(context[common:])
        self.last_catch_up = len(pending)
        if should_stop is None:
            self._llama.eval(pending)
            return True
        for start in range(0, len(pending), CATCH_UP_PIECE):
            if should_stop():
                return False
            started = time.perf_counter()
            self._llama.eval(pending[start:start + CATCH_UP_PIECE])
            if start + CATCH_UP_PIECE <= len(pending):  # a whole piece: how long the next one will take
                self.piece_s = 0.5 * self.piece_s + 0.5 * (time.perf_counter() - started) if self.piece_s else (
                    time.perf_counter() - started)
        return True

    def _last_logits(self) -> np.ndarray:
        """Logits (V,) of the last evaluated position, copied out of llama.cpp's buffer."""
        return self._logits_at(-1)


def _masked(logits: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """logits (V,) with every token outside `allowed` at -inf."""
    return logits if allowed is None else masked_logits(logits, allowed)


def _candidates(logits: np.ndarray, params: SamplingParams, clocks: np.ndarray | None) -> list[tuple[int, float]]:
    """The BRANCH_CHOICES best next tokens and the chance of each being the target's: by probability
    (greedy: the drafter's probability), or in the race's order over `clocks` among the distribution as
    it travels on the wire (truncated), with the race's chance of each (RACE_SPREAD)."""
    if params.greedy:
        scaled = logits.astype(np.float64)
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        best = np.argpartition(-probs, BRANCH_CHOICES)[:BRANCH_CHOICES]
        best = best[np.lexsort((best, -probs[best]))]  # by probability, ties by id (as argmax breaks them)
        return [(int(t), float(probs[t])) for t in best]
    ids, probs, arrival = race_candidates(logits, params, clocks)
    return [(int(token), float(chance)) for token, chance in zip(ids, race_chance(arrival, params.temperature))]


def race_candidates(logits: np.ndarray, params: SamplingParams,
                    clocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The drafter's BRANCH_CHOICES first tokens to arrive in the race over `clocks`, among its
    distribution as it travels on the wire (truncated): their ids, probabilities and arrival times
    (clock over probability), first to arrive first (the drafter's guess)."""
    dist = truncate(warp(logits, params), WIRE_TOP_K_CAP)
    ids = np.asarray(dist.ids, dtype=np.int64)
    probs = np.asarray(dist.probs, dtype=np.float64)
    arrival = clocks[ids] / probs
    order = np.argsort(arrival, kind="stable")[:BRANCH_CHOICES]
    return ids[order], probs[order], arrival[order]


def race_chance(arrival: np.ndarray, temperature: float, spread: float = RACE_SPREAD) -> np.ndarray:
    """Each candidate's chance of being the target's pick, from the race's arrival times (first first):
    t ** -(T / spread), over the candidates (RACE_SPREAD)."""
    arrival = np.maximum(arrival, 1e-300)  # a clock of exactly 0 (once in 2**53) arrives first, surely
    weights = (arrival[0] / arrival) ** (temperature / spread)
    return weights / weights.sum()
