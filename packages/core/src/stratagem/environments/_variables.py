"""Reading a job's environment variables: every value is checked where it is read, and an error names
the variable, its value, what is accepted and who normally sets it."""

from __future__ import annotations

import math
import os
import socket
import threading
import warnings

MAX_PORT = 65535

RESOLVE_SECONDS = 5.0
"""How long a rendezvous host name may take to resolve before it is left to the join timeout."""


def int_variable(
    name: str, default: int | None = None, *, minimum: int | None = None, maximum: int | None = None, hint: str = ""
) -> int:
    """``int(os.environ[name])``, or ``default`` when unset; ``ValueError`` naming the variable otherwise.

    ``minimum`` and ``maximum`` bound the value (both included). ``hint`` is a sentence appended
    to every error (who normally sets the variable).
    """
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise _unset(name, hint)
        return default
    try:
        number = int(value)
    except ValueError:
        raise _invalid(name, value, "an integer" + _range_text(minimum, maximum), hint) from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise _invalid(name, value, "an integer" + _range_text(minimum, maximum), hint)
    return number


def optional_int_variable(
    name: str, *, minimum: int | None = None, maximum: int | None = None, hint: str = ""
) -> int | None:
    """Like :func:`int_variable` when ``name`` is set, ``None`` when it is unset."""
    if name not in os.environ:
        return None
    return int_variable(name, minimum=minimum, maximum=maximum, hint=hint)


def size_variable(name: str, *, hint: str = "") -> int:
    """A number of processes or nodes: an integer of at least 1."""
    return int_variable(name, minimum=1, hint=hint)


def rank_variable(name: str, size_name: str | None = None, *, hint: str = "") -> int:
    """A rank: an integer from 0, and below the value of ``size_name`` when that variable is given and set."""
    rank = int_variable(name, minimum=0, hint=hint)
    if size_name is not None and size_name in os.environ:
        check_rank(name, rank, size_variable(size_name, hint=hint), f"{size_name}={os.environ[size_name]}", hint=hint)
    return rank


def check_rank(name: str, rank: int, size: int, size_text: str, *, hint: str = "") -> None:
    """``ValueError`` unless ``0 <= rank < size``; ``size_text`` says where ``size`` comes from."""
    if not 0 <= rank < size:
        expected = "0" if size == 1 else f"0 to {size - 1}"
        raise ValueError(
            _sentences(
                f"The environment variable {name}={rank} is out of range for {size_text}; expected {expected} "
                "(ranks count from 0).",
                hint,
            )
        )


def port_variable(name: str, default: int | None = None, *, hint: str = "") -> int:
    """A TCP port every rank connects to: 1 to 65535 (0 would let each rank's system pick a different one)."""
    return int_variable(name, default, minimum=1, maximum=MAX_PORT, hint=hint)


def seconds_variable(name: str, default: float, *, maximum: float | None = None) -> float:
    """A positive, finite number of seconds (at most ``maximum``), or ``default`` when unset."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0 and (maximum is None or seconds <= maximum)):
        bound = "" if maximum is None else f" up to {maximum:.0f}"
        raise _invalid(name, value, f"a positive number of seconds{bound}", "")
    return seconds


def str_variable(name: str, *, hint: str = "") -> str:
    """``os.environ[name]``; ``ValueError`` naming the variable when it is unset or empty."""
    value = os.environ.get(name)
    if not value:
        raise _unset(name, hint)
    return value


def first_set(*names: str) -> str | None:
    """The first of ``names`` that is set in the environment, or ``None``."""
    return next((name for name in names if name in os.environ), None)


def check_main_address(address: str, *, must_resolve_now: bool, derived_from: str = "") -> None:
    """Refuse a rendezvous host name that this host cannot resolve, which would otherwise be retried until
    the join timeout.

    The address is ``MASTER_ADDR`` when that is set, else what ``derived_from`` says (e.g. "the
    job's first node"), which the messages name. With
    ``must_resolve_now`` false (a node other than node 0, whose rendezvous host may not be up yet
    and so not yet in DNS), a name that does not resolve is only a warning. A resolver that does
    not answer within :data:`RESOLVE_SECONDS`, or answers "try again", is left to the join timeout.
    """
    outcome: list[OSError | None] = []

    def resolve() -> None:
        try:
            socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
            outcome.append(None)
        except OSError as error:
            outcome.append(error)

    resolver = threading.Thread(target=resolve, name="stratagem-resolve-main-address", daemon=True)
    resolver.start()
    resolver.join(RESOLVE_SECONDS)
    error = outcome[0] if outcome else None
    if not isinstance(error, socket.gaierror) or error.errno not in _NO_SUCH_NAME:
        return
    source = f"MASTER_ADDR={address!r}" if os.environ.get("MASTER_ADDR") else f"{derived_from} {address!r}"
    message = (
        f"{source} does not resolve to an address on this host ({error.strerror}); it must be the host name or IP "
        "address of node 0, where rank 0 hosts the process-group rendezvous."
    )
    if must_resolve_now:
        raise ValueError(message)
    warnings.warn(f"{message} Waiting for it to appear until the join timeout.", RuntimeWarning, stacklevel=2)


_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def _range_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {minimum} to {maximum}"
    if minimum is not None:
        return f" of at least {minimum}"
    if maximum is not None:
        return f" of at most {maximum}"
    return ""


def _invalid(name: str, value: str, expected: str, hint: str) -> ValueError:
    return ValueError(_sentences(f"The environment variable {name}={value!r} is not valid; expected {expected}.", hint))


def _unset(name: str, hint: str) -> ValueError:
    return ValueError(_sentences(f"The environment variable {name} is not set.", hint))


def _sentences(*parts: str) -> str:
    return " ".join(part for part in parts if part)
