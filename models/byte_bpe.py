"""A small byte-level BPE vocabulary shared by the tiny target and its drafters.

All 256 bytes are tokens (written in GPT-2's byte-to-unicode alphabet, as both llama.cpp's
`gpt2` tokenizer model and Hugging Face's ByteLevel BPE expect), so any UTF-8 text
round-trips. A fixed list of merges adds common English and Python pieces, and two
control tokens close the list.
"""

from __future__ import annotations

from dataclasses import dataclass

from wire.byte_level import byte_to_unicode

BOS_TEXT = "<|begin|>"
EOS_TEXT = "<|endoftext|>"

# Merged pieces, each built from two existing tokens (in GPT-2 alphabet, "Ġ" is a space).
_MERGES = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("Ġ", "a"), ("o", "n"), ("r", "e"),
    ("Ġt", "he"), ("Ġ", "s"), ("e", "n"), ("a", "t"), ("o", "r"), ("Ġ", "w"), ("e", "s"),
    ("Ġ", "c"), ("i", "s"), ("Ġ", "f"), ("Ġ", "o"), ("i", "t"), ("Ġ", "b"), ("a", "n"),
    ("e", "d"), ("Ġ", "p"), ("a", "l"), ("in", "g"), ("Ġ", "d"), ("a", "r"), ("Ġ", "m"),
    ("Ġ", "i"), ("l", "e"), ("Ġ", "r"), ("o", "u"), ("Ġ", "n"), ("Ġ", "h"), ("s", "e"),
    ("Ġ", "re"), ("Ġ", "in"), ("Ġ", "l"), ("Ġ", "e"), ("Ġ", "g"), ("n", "d"), ("Ġa", "nd"),
    ("Ġo", "f"), ("Ġ", "("), ("Ġ", "="), ("d", "e"), ("de", "f"), ("Ġ", "def"),
    ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("Ċ", "ĠĠĠĠ"), ("r", "n"), ("t", "u"), ("tu", "rn"),
    ("re", "turn"), ("Ġ", "return"), ("e", "l"), ("s", "el"), ("sel", "f"), ("Ġ", "self"),
    ("(", "self"), ("Ġ", "x"),
]


@dataclass(frozen=True)
class ByteBPEVocab:
    tokens: list[str]  # token text in id order, GPT-2 alphabet
    merges: list[str]  # "left right", in rank order
    bos_id: int
    eos_id: int
    n_normal: int  # ids below this are ordinary tokens; the rest are control tokens

    @property
    def size(self) -> int:
        return len(self.tokens)


def build_vocab() -> ByteBPEVocab:
    alphabet = byte_to_unicode()
    tokens = [alphabet[b] for b in range(256)]
    merges = []
    known = set(tokens)
    for left, right in _MERGES:
        # Merges may only join pieces that already exist (earlier merges included).
        assert left in known and right in known, (left, right)
        merged = left + right
        if merged in known:
            continue
        tokens.append(merged)
        known.add(merged)
        merges.append(f"{left} {right}")
    n_normal = len(tokens)
    tokens += [BOS_TEXT, EOS_TEXT]
    return ByteBPEVocab(tokens, merges, bos_id=n_normal, eos_id=n_normal + 1, n_normal=n_normal)
