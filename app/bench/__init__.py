"""`specwire bench`: every way of generating, side by side, under emulated round-trip times."""
