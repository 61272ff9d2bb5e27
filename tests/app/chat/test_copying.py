"""`/copy`: code blocks found in a reply, and the command's argument."""

from __future__ import annotations

import pytest

from app.chat.copying import code_blocks, parse_copy_argument


def test_code_blocks_are_found_without_their_fences_and_an_open_one_counts():
    text = "Two ways:\n```python\ndef f():\n    return 1\n```\nor\n~~~\nx = 2\n~~~\nand a stopped one\n```c\nint main("
    assert code_blocks(text) == ["def f():\n    return 1", "x = 2", "int main("]
    assert code_blocks("no code") == []


def test_the_copy_argument_is_nothing_code_or_code_n():
    assert parse_copy_argument("") is None and parse_copy_argument("code") == -1
    assert parse_copy_argument("code 2") == 1
    for bad in ("all", "code 0", "code x", "code 1 2"):
        with pytest.raises(ValueError, match="/copy takes"):
            parse_copy_argument(bad)
