"""Text from the other side of the wire, made safe to show: no character of it acts on a terminal.

Two kinds of text reach a person's screen from a service or a model:
- what a service *says* (an error's message, a close reason, an HTTP body, its target's name):
  one line of words, where any character that is not printable (a newline, ESC, a bidi
  override) is shown as its escape, `\\x1b`, so an escape sequence can neither move the cursor
  nor write the clipboard (OSC 52) nor forge a line of our own (`escaped`);
- what a *model* writes (a reply): text whose newlines and tabs are its layout, and whose other
  control characters are shown as visible symbols, ESC as the control picture U+241B (`visible`).

Both sides use them: the service escapes what clients send before it logs it, the client
escapes everything a service says before anyone reads it.
"""

from __future__ import annotations

# C0 controls but tab and newline -> their Unicode control pictures; DEL and C1 likewise visible
_VISIBLE = {code: chr(0x2400 + code) for code in range(0x20) if code not in (0x09, 0x0A)}
_VISIBLE[0x7F] = "\u2421"
_VISIBLE.update({code: "\ufffd" for code in range(0x80, 0xA0)})
# what /copy leaves out: every control character but tab and newline (ESC, C1's CSI among them)
_CONTROLS = {code: None for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if code not in (0x09, 0x0A)}


def escaped(text: str, limit: int | None = None) -> str:
    """`text` (its first `limit` characters) with every character that is not printable
    (newlines, terminal escape sequences, line separators, bidi controls) written as its
    escape: `\\n`, `\\x1b`, `\\u202e`. The one function for everything a service says."""
    text = text[:limit] if limit is not None else text
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def visible(text: str) -> str:
    """Model output safe to put on a terminal: CRLF as LF, other control characters as symbols."""
    return text.replace("\r\n", "\n").translate(_VISIBLE)


def without_controls(text: str) -> str:
    """`text` with every control character but tab and newline left out (for a clipboard: pasted
    into a terminal, an escape sequence would run there)."""
    return text.replace("\r\n", "\n").translate(_CONTROLS)
