"""A recording thinned to a small drafter's acceptance: the drafter's guesses get worse, the target's paths stay."""

from benchmarks.emulation.recording import Recording, first_guess_acceptance, thinned


def test_thinning_reaches_the_acceptance_asked_and_leaves_the_paths():
    recording = Recording.load()
    before = first_guess_acceptance(recording)
    thin = thinned(recording, 0.7, seed=3)
    assert abs(first_guess_acceptance(thin) - 0.7) < 0.02 < before - 0.7
    assert [e.path for e in thin.entries] == [e.path for e in recording.entries]
    assert [e.prompt for e in thin.entries] == [e.prompt for e in recording.entries]
    # a guess made wrong is never the path's token, and a guess already wrong is left as it was
    for old, new in zip(recording.entries, thin.entries):
        for was, now, token in zip(old.guesses, new.guesses, old.path):
            assert now == was or (was == token and now != token)
    assert thinned(recording, 0.95) is recording  # already below the acceptance asked: as it is
