"""The real drafter growing a token tree along recorded replies: what a level costs after a frame.

    .venv/bin/python -m benchmarks.tree_drafter [--prompts 3] [--width 4] [--levels 3]

The default pair's drafter (llama.cpp, on this machine's device) grows a tree as the stream
speculator does (local_draft/draft_tree.py, `DraftModel.branch_guesses`), `--levels` levels between
two frames, along the target's recorded replies (benchmarks/emulation/recordings/default-pair.json):
each frame commits what the target would, the tree's nodes it walks down through and the target's
next token, and the tree goes on below them (or starts afresh where the target left it). Two ways of
taking a frame, side by side on the same replies, prompt by prompt in turn:

- `rerooted` (the drafter's own): the branches' root moves down to the committed tokens, the text
  takes their cells, and the first level after the frame decodes the newest token with its leaves;
- `read afresh`: a catch-up reads the committed tokens, and every open branch is decoded whole again.

It prints, for each, the decode calls and tokens in the first level after a frame (mean), the time
of that level and of the other levels (median), and at how many frames both grew the same tree
(the guesses are the drafter's either way; its probabilities move in their third decimal with a
batch's shape, so a candidate at a threshold may differ). A GPU prices a batch's tokens little and its decode calls
more; this machine's CPU prices the tokens: read the decode calls and tokens, not only the time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

from wire.draft_tree import ROOT
from wire.protocol import SamplingParams


def _child(tree, node: int, token: int) -> int | None:
    return next((i for i, parent in enumerate(tree.parents) if parent == node and tree.tokens[i] == token), None)


def _committed(tree, path: list[int], at: int, ahead: int) -> list[int]:
    """What a pass commits at `at` of the target's `path`: the nodes the path walks down through,
    and the target's own token after them. The pass had the tree but its newest `ahead` levels (the
    client grew them while the pass and its frame travelled), so the target's own token, and the
    nodes below it, may be in the client's tree."""
    depth = tree.levels
    node, taken = ROOT, 0
    while at + taken < len(path) and taken < depth - ahead:
        child = _child(tree, node, path[at + taken])
        if child is None:
            break
        node, taken = child, taken + 1
    return path[at:at + taken + 1]


@contextmanager
def _counting(draft, calls: list[int]):
    """Count the tokens of every decode the drafter runs (its levels' batches and its catch-ups)."""
    import local_draft.draft_model as draft_model

    decode, evaluate = draft_model.llama_cpp.llama_decode, draft._llama.eval
    draft_model.llama_cpp.llama_decode = lambda ctx, batch: (calls.append(batch.n_tokens), decode(ctx, batch))[1]
    draft._llama.eval = lambda tokens: (calls.append(len(tokens)), evaluate(tokens))[1]
    try:
        yield
    finally:
        draft_model.llama_cpp.llama_decode = decode
        del draft._llama.eval


def grow_along(draft, entry, width: int, levels: int, ahead: int, max_tokens: int, reroot: bool) -> dict:
    """Grow a tree along one recorded reply; returns the figures of the frames and levels."""
    from local_draft.draft_tree import DraftTree

    params, none = SamplingParams(), (lambda position: None)
    end_ids = draft.end_ids
    original = draft._reroot
    if not reroot:
        draft._reroot = lambda context: None
    history = list(entry.prompt)
    path = entry.path[:max_tokens]
    at, number = 0, 1
    tree = DraftTree(number, len(history), width)
    after_frame_s, other_s, after_frame_tokens, after_frame_calls, shapes = [], [], [], [], []
    draft._drop_branches()
    draft.rollback(0)
    draft.keep_up(history)
    try:
        while at < len(path):
            for level in range(levels):
                if not tree.open:
                    break
                calls: list[int] = []
                began = time.perf_counter()
                with _counting(draft, calls):
                    candidates = draft.branch_guesses(history, tree.open_paths(), params, none)
                spent = time.perf_counter() - began
                tree.grow(candidates, end_ids)
                if level == 0 and at:
                    after_frame_s.append(spent)
                    after_frame_tokens.append(sum(calls))
                    after_frame_calls.append(len(calls))
                else:
                    other_s.append(spent)
            shapes.append((tuple(tree.tokens), tuple(tree.parents)))
            committed = _committed(tree, path, at, ahead)
            at += len(committed)
            history += committed
            right = tree.follow(committed)[0]
            below = tree.below(right, committed, number, end_ids) if right == len(committed) else None
            if below is None:
                number += 1
                below = DraftTree(number, len(history), width)
            tree = below
    finally:
        draft._reroot = original
    return dict(after_frame_s=after_frame_s, other_s=other_s, after_frame_tokens=after_frame_tokens,
                after_frame_calls=after_frame_calls, shapes=shapes, frames=len(shapes))


def main() -> None:
    from benchmarks.emulation.recording import Recording
    from local_draft.draft_model import DraftModel
    from models.registry import file_path, get_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="recorded replies to grow along (the first N)")
    parser.add_argument("--width", type=int, default=4, help="leaves grown together at most (the tree's width)")
    parser.add_argument("--levels", type=int, default=4, help="levels grown between two frames")
    parser.add_argument("--ahead", type=int, default=2, help="levels the client grew after the pass took the tree "
                        "(on the emulated 70B at 14 ms about two: a pass is seven of the drafter's levels, the round "
                        "trip five)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens of each reply")
    args = parser.parse_args()
    pair = get_pair()
    draft = DraftModel(file_path(pair, pair.draft), n_ctx=4096)
    entries = Recording.load().entries[:args.prompts]
    results = {True: [], False: []}
    for entry in entries:
        for reroot in (True, False):
            results[reroot].append(grow_along(draft, entry, args.width, args.levels, args.ahead, args.max_tokens,
                                              reroot))
    pairs = [(x, y) for a, b in zip(results[True], results[False]) for x, y in zip(a["shapes"], b["shapes"])]
    same = sum(x == y for x, y in pairs)
    print(f"the default pair's drafter ({'GPU' if draft.gpu_offload else 'CPU'}), {len(entries)} replies of up to "
          f"{args.max_tokens} tokens, width {args.width}, {args.levels} levels a frame, the pass {args.ahead} "
          f"levels behind")
    print("| frames taken | frames | decode calls in the first level after a frame | tokens decoded in it (mean) "
          "| its time ms (median) | other levels ms (median) |")
    print("|---|---|---|---|---|---|")
    for reroot, name in ((True, "rerooted"), (False, "read afresh")):
        runs = results[reroot]
        after = [s for run in runs for s in run["after_frame_s"]]
        other = [s for run in runs for s in run["other_s"]]
        tokens = [n for run in runs for n in run["after_frame_tokens"]]
        calls = [n for run in runs for n in run["after_frame_calls"]]
        print(f"| {name} | {sum(run['frames'] for run in runs)} | {statistics.mean(calls):.2f} | "
              f"{statistics.mean(tokens):.1f} | {1000 * statistics.median(after):.1f} | "
              f"{1000 * statistics.median(other):.1f} |")
    print(f"the same trees both ways at {same} of {len(pairs)} frames (a level's probabilities differ in their third "
          f"decimal with the batch's shape on a CPU's kernels: a candidate near a threshold may go either way)")


if __name__ == "__main__":
    main()
