"""When the drafter works during a stream: from the measured costs and the stream's measured rate."""

from __future__ import annotations

import pytest

from local_draft.stream_controller import (
    FIRST_REST_TOKENS, HOPELESS_REST_TOKENS, MAX_REST_TOKENS, MIN_FRAMES, PROBE_TOKENS, StreamController,
)
from wire.protocol import PassCost

GPU = [PassCost(tokens=n, ms=5.5 + 0.025 * (n - 1)) for n in (1, 2, 4, 8, 16, 32)]  # a pass costs about a step
CPU = [PassCost(tokens=n, ms=60.0 * n) for n in (1, 2, 4, 8, 16, 32)]  # every token costs a step


def frames(controller: StreamController, count: int, tokens: int, interval_s: float) -> None:
    for _ in range(count):
        controller.observe_frame(tokens, interval_s, controller.drafting)


def test_a_device_that_charges_every_token_a_step_never_starts_the_drafter():
    """possible_gain is 1 when a pass of n tokens costs n steps: the drafter never works."""
    controller = StreamController(curve=CPU)
    assert controller.possible_gain(0.99) == pytest.approx(1.0)
    frames(controller, 200, 1, 0.060)
    assert not controller.drafting


def test_a_flat_curve_probes_after_the_rate_to_beat_is_measured():
    """On a GPU-like curve the drafter starts once MIN_FRAMES frames at rest measured the stream."""
    controller = StreamController(curve=GPU)
    assert controller.possible_gain(0.9) > 2
    frames(controller, MIN_FRAMES - 1, 1, 0.0055)
    assert not controller.drafting
    frames(controller, 1, 1, 0.0055)
    assert controller.drafting


def test_a_probe_that_loses_rests_and_the_rest_doubles_each_time():
    """Drafting slower than resting (a drafter that takes the service's cores): back to rest, for
    FIRST_REST_TOKENS tokens, then twice as long after the next losing probe."""
    controller = StreamController(curve=GPU)
    frames(controller, MIN_FRAMES, 1, 0.0055)
    assert controller.drafting
    frames(controller, PROBE_TOKENS, 1, 0.0080)  # slower while drafting
    assert not controller.drafting and controller.rest_tokens == FIRST_REST_TOKENS
    frames(controller, FIRST_REST_TOKENS, 1, 0.0055)
    assert controller.drafting
    frames(controller, PROBE_TOKENS, 1, 0.0080)
    assert not controller.drafting and controller.rest_tokens == 2 * FIRST_REST_TOKENS


def test_a_probe_that_wins_keeps_drafting():
    """Drafting that commits 3 tokens a pass keeps the drafter working."""
    controller = StreamController(curve=GPU)
    frames(controller, MIN_FRAMES, 1, 0.0055)
    frames(controller, 40, 3, 0.0060)
    assert controller.drafting and controller.rest_tokens == 0


def test_a_set_k_overrides_the_measurements():
    """--k N always drafts (at most N guesses past the stream), --k 0 never."""
    controller = StreamController(curve=CPU, max_block=4)
    controller.new_reply()
    assert controller.drafting and controller.horizon(100.0) <= 4 + 2
    controller.max_block = 0
    controller.new_reply()
    assert not controller.drafting and controller.horizon(100.0) == 0


def test_the_horizon_covers_the_tokens_made_while_a_guess_travels():
    """The received text is half a round trip old and a guess travels the other half: at 100 ms of
    round trip and 200 tokens/s, a chain runs 20 tokens further ahead than at 0 ms."""
    controller = StreamController(curve=GPU, max_block=8)
    controller.new_reply()
    near = controller.horizon(200.0)
    controller.observe_wire(0.100)
    assert controller.passed(200.0) == 20
    assert controller.horizon(200.0) - near == 20


def test_a_state_round_trips_and_a_damaged_one_is_refused():
    """state() restores into a new controller; a damaged state raises ValueError and changes nothing."""
    controller = StreamController(curve=GPU)
    frames(controller, MIN_FRAMES, 1, 0.0055)
    frames(controller, PROBE_TOKENS, 1, 0.0090)
    restored = StreamController(curve=GPU)
    restored.restore(controller.state())
    assert restored.state() == controller.state()
    fresh = StreamController()
    for damaged in ({"acceptance": "x"}, {**controller.state(), "guess_s": [float("nan"), 1.0]},
                    {**controller.state(), "wire_s": [10 ** 400, 1.0]}):
        with pytest.raises(ValueError):
            fresh.restore(damaged)
    assert fresh.state() == StreamController().state()
    fresh.restore({**controller.state(), "rest_tokens": 10 ** 400})  # an absurd rest is cut to the longest
    assert fresh.rest_tokens == 2048


CPU_BLOCKS = [PassCost(tokens=n, ms=60.0 + 35.0 * (n - 1)) for n in (1, 2, 4, 8, 16, 32)]  # blocks cheaper per token


def test_a_drafter_that_slows_the_service_on_its_machine_stops_being_worth_a_probe():
    """Blocks cheaper per token than steps make a probe look worth it, until the frames show the
    service's passes 1.6x slower while the drafter works: then drafting cannot pay, and it rests."""
    controller = StreamController(curve=CPU_BLOCKS)
    assert controller.possible_gain(0.9) > 1.1 and controller.interference == 1.0
    for _ in range(MIN_FRAMES):
        controller.observe_frame(1, 0.060, False, forward_s=0.060, pass_tokens=1)
    assert controller.drafting  # a probe
    for _ in range(PROBE_TOKENS):
        controller.observe_frame(1, 0.095, True, forward_s=0.096, pass_tokens=1)
    assert not controller.drafting and controller.interference == pytest.approx(1.6)
    assert controller.possible_gain(0.95) < 1.02
    # a refresh probe halves the reply it falls in (on two cores): at most one in 100 replies of 96 tokens
    assert HOPELESS_REST_TOKENS >= 100 * 96
    for _ in range(HOPELESS_REST_TOKENS - 1):  # no rest short of the hopeless one is long enough now
        controller.observe_frame(1, 0.060, False, forward_s=0.060, pass_tokens=1)
        assert not controller.drafting
    controller.observe_frame(1, 0.060, False, forward_s=0.060, pass_tokens=1)
    assert controller.drafting  # then one probe, in case the machine has changed


def test_a_fresh_drafter_is_priced_by_the_cores_it_takes_from_a_service_on_its_machine():
    """Before anything is measured: one drafting thread of two cores leaves the service's passes
    half the machine (they take twice as long), so blocks cheaper per token than steps are not
    worth a probe; of sixteen cores it takes little, and a probe is worth making. Measured
    slowdowns replace the first guess."""
    two_cores = StreamController(curve=CPU_BLOCKS, drafter_share=0.5)
    assert two_cores.interference == pytest.approx(2.0) and two_cores.possible_gain(0.9) == 1.0  # no gain
    for _ in range(200):
        two_cores.observe_frame(1, 0.060, False, forward_s=0.060, pass_tokens=1)
    assert not two_cores.drafting
    sixteen = StreamController(curve=CPU_BLOCKS, drafter_share=1 / 16)
    assert sixteen.interference == pytest.approx(16 / 15) and sixteen.possible_gain(0.9) > 1.1
    frames(sixteen, MIN_FRAMES, 1, 0.060)
    assert sixteen.drafting
    elsewhere = StreamController(curve=CPU_BLOCKS, colocated=False, drafter_share=0.5)
    assert elsewhere.interference == 1.0
    measured = StreamController(curve=CPU_BLOCKS, drafter_share=0.5)
    measured.restore({**measured.state(), "slowdown_drafting": [1.1, 1.0], "slowdown_resting": [1.0, 1.0]})
    assert measured.interference == pytest.approx(1.1)


@pytest.mark.parametrize("curve", [
    [PassCost(tokens=1, ms=5.0), PassCost(tokens=2, ms=5.5), PassCost(tokens=2, ms=9.0)],  # a size twice
    [PassCost(tokens=0, ms=5.0), PassCost(tokens=-4, ms=1.0), PassCost(tokens=3, ms=6.0)],  # no such sizes
    [PassCost(tokens=1, ms=float("nan")), PassCost(tokens=2, ms=float("inf")), PassCost(tokens=4, ms=-1.0)],
    [PassCost(tokens=1, ms=0.0), PassCost(tokens=2, ms=0.0)],  # passes that cost nothing
], ids=["duplicate-size", "sizes-below-one", "not-finite-or-negative", "all-zero"])
def test_a_curve_a_broken_service_states_neither_crashes_nor_steers_the_drafter(curve):
    """A Welcome's curve is read point by point: a duplicate size, a size below one, a time that is
    not a finite duration are dropped, and a curve that says passes cost nothing gives no gain to act
    on (the controller probes and measures), where it divided by zero before."""
    controller = StreamController(curve=curve)
    gain = controller.possible_gain(0.9)
    assert gain >= 1.0
    for n in (1, 2, 5, 40):
        seconds = controller.seconds(n)
        assert seconds is None or 0.0 <= seconds < 3600
    frames(controller, 3 * MIN_FRAMES, 1, 0.0055)  # the stream goes on, whatever the curve said
