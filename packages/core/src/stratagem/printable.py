"""Text that came from a file, a checkpoint or the user, made safe to put into a message or onto a terminal."""

from __future__ import annotations

import re
import reprlib

SHOWN_CHARACTERS = 200
"""How much of a value from outside a message shows; the rest is counted, not echoed."""

# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators: each could
# clear the screen, retitle the window or start a forged line of output.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object, limit: int = SHOWN_CHARACTERS, *, keep_newlines: bool = False, tail: bool = False) -> str:
    """``str(text)`` with control characters escaped (``\\x1b``, ``\\n``) and cut to ``limit`` characters.

    What is cut is said (``... (52428800 characters in all)``), so a long value neither floods the
    message nor looks whole. ``keep_newlines`` leaves line breaks of a text meant to have several
    lines (a traceback); ``tail`` keeps its end instead of its start.
    """
    text = str(text)
    if len(text) <= limit:
        return _escaped(text, keep_newlines)
    if tail:
        return f"({len(text)} characters in all) ..." + _escaped(text[-limit:], keep_newlines)
    return _escaped(text[:limit], keep_newlines) + f"... ({len(text)} characters in all)"


def _escaped(text: str, keep_newlines: bool) -> str:
    control = _CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL
    return control.sub(_escape, text)


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


def raised_at(error: BaseException) -> str:
    """``KeyError: 'x' (at model.py:12)``: the error's first line and the last line of code it passed through, for
    a message about the user's own code failing that shows no traceback."""
    import traceback
    from pathlib import Path

    if isinstance(error, SyntaxError) and error.filename:
        return f"SyntaxError: {printable(error.msg)} (at {Path(error.filename).name}:{error.lineno})"
    frames = traceback.extract_tb(error.__traceback__)
    place = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    lines = str(error).strip().splitlines()
    message = f": {printable(lines[0])}" if lines else ""
    return f"{type(error).__name__}{message}{place}"
