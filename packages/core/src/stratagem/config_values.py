"""Reading a configuration the user wrote (a JSON file, a dict of options): a number beyond a float, NaN, or
nesting deeper than any configuration needs is a ``ValueError`` naming where it came from and the key."""

from __future__ import annotations

import json
import math
from typing import Any

from stratagem.printable import printable

MAX_NESTING = 64
"""Deeper than any configuration stratagem or a backend reads; a deeper one is refused, not recursed into."""


def parse_json(text: str, origin: str) -> Any:
    """``json.loads(text)`` checked by :func:`check_config_values`; ``origin`` (e.g. ``"config='ds.json'"``) starts
    every error message."""

    def refuse_constant(name: str) -> Any:
        raise _NotANumber(f"{origin}: {name} is not a number; give a finite value.")

    def finite_float(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise _NotANumber(f"{origin}: the number {printable(literal, 40)} is beyond what a float holds.")
        return value

    try:
        loaded = json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except _NotANumber as error:
        raise ValueError(str(error)) from None
    except RecursionError:
        raise ValueError(f"{origin}: the JSON is nested too deeply (more than {MAX_NESTING} levels).") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{origin}: not valid JSON ({error}).") from None
    except ValueError as error:  # an integer literal with more digits than Python converts
        raise ValueError(f"{origin}: holds a value that cannot be read ({printable(error)}).") from None
    check_config_values(loaded, origin)
    return loaded


def check_config_values(value: Any, origin: str) -> None:
    """Refuse NaN and infinite floats anywhere in ``value`` (dicts and lists, walked without recursion) and nesting
    deeper than :data:`MAX_NESTING`, naming ``origin`` and the key."""
    pending: list[tuple[Any, str, int]] = [(value, "", 0)]
    while pending:
        item, where, depth = pending.pop()
        if depth > MAX_NESTING:
            raise ValueError(f"{origin}: the value is nested more than {MAX_NESTING} levels deep (at {where}).")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{origin}: {where or 'the value'} is {item}; give a finite number.")
        if isinstance(item, dict):
            pending += [(entry, f"{where}.{printable(key, 60)}".lstrip("."), depth + 1) for key, entry in item.items()]
        elif isinstance(item, list | tuple):
            pending += [(entry, f"{where}[{index}]", depth + 1) for index, entry in enumerate(item)]


class _NotANumber(Exception):
    """Raised inside ``json.loads`` (whose ValueErrors it would otherwise mix with its own)."""
