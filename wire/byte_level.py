"""GPT-2's byte-level alphabet: the reversible map from bytes to printable characters.

Byte-level BPE vocabularies (GPT-2, Qwen) write each token's bytes in these characters. The tiny
test vocabulary is built with it (models/byte_bpe.py), and a grammar reads tokens' bytes back
through its inverse (wire/grammar.py).
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):  # the rest move past 255, in order
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """The inverse: each alphabet character's byte."""
    return {char: byte for byte, char in byte_to_unicode().items()}
