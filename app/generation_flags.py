"""How to generate, as flags: sampling and the draft length, declared and checked once.

`generate`, `chat` and `bench` take the same sampling flags; `generate`, `chat` and the
chat's `/k` read a draft length with the same parser.
"""

from __future__ import annotations

import argparse

from app.user_error import UserError
from wire.protocol import SamplingParams
from wire.randomness import seed_problem


def parse_k(text: str) -> int | None:
    """A draft length: "auto" -> None (chosen each round), a count >= 0 -> that count."""
    if text.strip().lower() == "auto":
        return None
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"k takes a number of draft tokens or auto, got {text!r}") from None
    if k < 0:
        raise ValueError(f"k must be 0 or more, got {k}")
    return k


def k_flag(text: str) -> int | None:
    """--k, for argparse: parse_k with argparse's error type."""
    try:
        return parse_k(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_k_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--k", type=k_flag, default=None, metavar="N|auto",
                        help="how many tokens to draft: auto (default: by measured acceptance and costs, none "
                             "where drafting does not pay) or a number (0: none, the service makes every "
                             "token); the guesses kept ahead of the stream, or with --mode rounds the draft "
                             "tokens per round")


NGRAM = "ngram"  # --draft ngram: draft by copying the context, no model
MIX_BY_DEFAULT = False  # mixing n-gram drafts into the model's is a flag until measured not to lose


def add_mix_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--mix-ngram", dest="mix_ngram", action=argparse.BooleanOptionalAction,
                        default=MIX_BY_DEFAULT,
                        help="each round, draft by copying the context (n-gram) instead of running the draft "
                             "model when its measured acceptance makes that faster (default: %(default)s)")


def drafting(args: argparse.Namespace) -> str:
    """Who drafts: "ngram" (--draft ngram, no model), "mixed" (--mix-ngram) or "model"."""
    if getattr(args, "draft", None) == NGRAM:
        return "ngram"
    return "mixed" if getattr(args, "mix_ngram", False) else "model"


def seed_flag(text: str) -> int:
    """--seed, for argparse: an integer the wire carries (0 .. 2**64 - 1)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is a whole number, got {text!r}") from None
    if seed_problem(seed):
        raise argparse.ArgumentTypeError(seed_problem(seed))
    return seed


def add_sampling_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, seed: int | None = None) -> None:
    """--temperature, --top-k, --top-p and --seed (default `seed`: None draws a fresh one)."""
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 keeps every token")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=seed_flag, default=seed,
                        help="makes sampled output reproducible (the drafter and the service draw from "
                             "independent streams of it)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams the flags ask for; UserError saying what is wrong with them."""
    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p).checked()
    except ValueError as exc:
        raise UserError(str(exc)) from exc
