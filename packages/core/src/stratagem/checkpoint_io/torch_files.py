"""Reading one ``torch.save`` file of a checkpoint, with an error that says what is wrong with it."""

from __future__ import annotations

import errno
import pickle
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io.confined import regular_file
from stratagem.checkpoint_io.errors import CheckpointError
from stratagem.printable import printable

_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")

# What torch.load raises for bytes that are not (or no longer) what torch.save wrote.
_CORRUPTION = (EOFError, KeyError, IndexError, ValueError, UnicodeDecodeError, struct.error)


def load_torch_file(
    path: Path,
    map_location: torch.device | str | None = "cpu",
    weights_only: bool = True,
    safe_globals: Sequence[Any] = (),
    mmap: bool = False,
) -> Any:
    """``torch.load`` of ``path``; a file that cannot be read raises :class:`CheckpointError` naming it.

    ``safe_globals`` are classes a weights-only load accepts besides tensors and containers (those a
    backend's own files are known to pickle). An empty, truncated or corrupt file is reported as
    such, never with advice to switch the weights-only check off: only a valid pickle that
    references a refused global is, with that global named.
    """
    if regular_file(path).stat().st_size == 0:
        raise CheckpointError(f"{str(path)!r} is an empty file, not a checkpoint (was its save interrupted?).")
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except Exception as error:
        explained = explain_load_failure(repr(str(path)), error, weights_only)
        if explained is None:
            raise
        raise explained from error


def explain_load_failure(what: str, error: Exception, weights_only: bool) -> CheckpointError | None:
    """The :class:`CheckpointError` for ``torch.load`` failing with ``error`` on ``what`` (a quoted path,
    or an entry's name), or ``None`` when the failure is not about those bytes (no memory, a bad
    ``map_location``, ...)."""
    if isinstance(error, pickle.UnpicklingError):
        refused = _REFUSED_GLOBAL.search(str(error)) if weights_only else None
        if refused is not None:
            return CheckpointError(
                f"{what} references {refused.group(1)}, which a weights-only load does not allow: unpickling it "
                "could run code. Only if you trust the file, load it with weights_only=False "
                "(e.g. Trainer.fit(..., weights_only=False), stratagem consolidate --no-weights-only)."
            )
        return _corrupt(what, error)
    if isinstance(error, RuntimeError):
        return _corrupt(what, error) if "PytorchStreamReader" in str(error) else None
    if isinstance(error, OSError):
        return _corrupt(what, error) if error.errno == errno.EINVAL else None
    return _corrupt(what, error) if isinstance(error, _CORRUPTION) else None


def _corrupt(what: str, error: BaseException) -> CheckpointError:
    return CheckpointError(
        f"{what} is truncated or corrupt, or not a file torch.save wrote: torch.load cannot read it "
        f"({type(error).__name__}: {_detail(error)}). Was it copied or written incompletely?"
    )


def _detail(error: BaseException) -> str:
    # torch's weights-only message suggests weights_only=False whatever the cause; keep only the cause.
    message = str(error)
    if "WeightsUnpickler error:" in message:
        message = message.split("WeightsUnpickler error:", 1)[1]
    return printable(next((line.strip() for line in message.splitlines() if line.strip()), "no detail"), 300)
