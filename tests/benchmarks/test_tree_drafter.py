"""benchmarks/tree_drafter.py: the real (tiny) drafter grows trees along a reply both ways."""

from __future__ import annotations


def test_a_rerooted_tree_takes_each_frame_in_one_decode_where_reading_afresh_takes_two(close_draft):
    """Along a reply the drafter itself would write (so the trees go on below each frame's tokens), the
    first level after a frame is one decode of fewer tokens rerooted, and a catch-up's decode and the
    level's read afresh; both take the same frames."""
    from benchmarks.emulation.recording import Recorded
    from benchmarks.tree_drafter import grow_along
    from wire.protocol import SamplingParams

    prompt = close_draft.tokenize("def quicksort(arr):")
    path: list[int] = []
    for _ in range(24):
        path.append(close_draft.guess(prompt + path, SamplingParams(), None))
    entry = Recorded("code", "def quicksort(arr):", prompt, path, list(path), "max_tokens")
    rerooted = grow_along(close_draft, entry, 4, 4, 2, 24, reroot=True)
    afresh = grow_along(close_draft, entry, 4, 4, 2, 24, reroot=False)
    assert rerooted["frames"] == afresh["frames"] > 2
    assert set(rerooted["after_frame_calls"]) == {1}, rerooted
    assert max(afresh["after_frame_calls"]) == 2, afresh
    assert sum(rerooted["after_frame_tokens"]) < sum(afresh["after_frame_tokens"])
