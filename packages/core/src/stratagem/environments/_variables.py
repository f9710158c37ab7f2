"""Reading a job's environment variables, with errors that name the variable and who sets it."""

from __future__ import annotations

import os


def int_variable(name: str, default: int | None = None, *, hint: str = "") -> int:
    """``int(os.environ[name])``, or ``default`` when unset; ``ValueError`` naming the variable otherwise.

    ``hint`` is a sentence appended to the error for an unset variable (who normally sets it).
    """
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise _unset(name, hint)
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"The environment variable {name}={value!r} is not an integer.") from None


def optional_int_variable(name: str) -> int | None:
    """``int(os.environ[name])`` when set, ``None`` when unset; ``ValueError`` when set but not an integer."""
    if name not in os.environ:
        return None
    return int_variable(name)


def str_variable(name: str, *, hint: str = "") -> str:
    """``os.environ[name]``; ``ValueError`` naming the variable when it is unset or empty."""
    value = os.environ.get(name)
    if not value:
        raise _unset(name, hint)
    return value


def first_set(*names: str) -> str | None:
    """The first of ``names`` that is set in the environment, or ``None``."""
    return next((name for name in names if name in os.environ), None)


def _unset(name: str, hint: str) -> ValueError:
    return ValueError(" ".join(part for part in (f"The environment variable {name} is not set.", hint) if part))
