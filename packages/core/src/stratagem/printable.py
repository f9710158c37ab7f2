"""Text that came from a file, a checkpoint or the user, made safe to put into a message or onto a terminal."""

from __future__ import annotations

import re
import reprlib

SHOWN_CHARACTERS = 200
"""How much of a value from outside a message shows; the rest is counted, not echoed."""

# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators: each could
# clear the screen, retitle the window or start a forged line of output.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object, limit: int = SHOWN_CHARACTERS) -> str:
    """``str(text)`` with control characters escaped (``\\x1b``, ``\\n``) and cut to ``limit`` characters.

    What is cut is said (``... (52428800 characters in all)``), so a long value neither floods the
    message nor looks whole.
    """
    text = str(text)
    cut = text[:limit]
    escaped = _CONTROL.sub(_escape, cut)
    if len(text) > limit:
        escaped += f"... ({len(text)} characters in all)"
    return escaped


def shown_repr(value: object, limit: int = SHOWN_CHARACTERS) -> str:
    """``repr(value)`` for a message: long strings and containers abridged (``...``), control characters
    escaped, at most ``limit`` characters."""
    return printable(_ABRIDGED.repr(value), limit)


def _abridged_repr() -> reprlib.Repr:
    abridged = reprlib.Repr()
    abridged.maxstring = abridged.maxother = SHOWN_CHARACTERS // 2
    abridged.maxlevel = 4
    return abridged


_ABRIDGED = _abridged_repr()


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if character in named:
        return named[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
