"""The shared generation flags: a --seed outside what the wire carries is refused by the parser."""

from __future__ import annotations

import argparse

import pytest

from app.generation_flags import add_sampling_arguments


@pytest.mark.parametrize("text, problem", [("-1", "2**64 - 1"), (str(2**64), "2**64 - 1"), ("1.5", "whole number")])
def test_a_seed_the_wire_cannot_carry_is_refused(text, problem, capsys):
    """--seed takes 0 .. 2**64 - 1; anything else is an argparse error naming the range."""
    parser = argparse.ArgumentParser()
    add_sampling_arguments(parser)
    assert parser.parse_args(["--seed", str(2**64 - 1)]).seed == 2**64 - 1
    with pytest.raises(SystemExit):
        parser.parse_args(["--seed", text])
    assert problem in capsys.readouterr().err
