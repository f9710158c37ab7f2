"""Reading a checkpoint whatever strategy wrote it."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from stratagem.checkpoint_io.errors import CheckpointError
from stratagem.printable import printable, shown_repr


def read_full_checkpoint(
    path: PathLike, preferred: CheckpointIO, weights_only: bool = True, required: Collection[str] = ()
) -> dict[str, Any]:
    """Read the whole checkpoint at ``path`` as plain state: into memory, except entries the reader
    defers until they are taken (see :class:`~stratagem.checkpoint_io.LazyCheckpoint`).

    ``preferred`` (the running strategy's IO) reads it if it recognises the layout; otherwise
    every registered checkpoint IO is asked (:meth:`CheckpointIO.can_read`), so a directory of
    shards written by one strategy loads into another. What was read is checked by
    :func:`check_checkpoint` (``required``: the entries the caller will take from it).
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"No checkpoint at {str(target)!r}.")
    checkpoint = _reader_of(target, preferred).load_checkpoint(target, weights_only=weights_only)
    return check_checkpoint(checkpoint, target, required)


def check_checkpoint(checkpoint: object, path: PathLike, required: Collection[str] = ()) -> dict[str, Any]:
    """``checkpoint`` if it is a dict of named entries holding every ``required`` one; else a
    :class:`CheckpointError` naming ``path`` and saying what it holds instead."""
    if not isinstance(checkpoint, dict) or not all(isinstance(key, str) for key in checkpoint):
        raise CheckpointError(
            f"{str(path)!r} is not a stratagem checkpoint: it holds {_describe(checkpoint)}, not a dict of named "
            "entries."
        )
    missing = [key for key in required if key not in checkpoint]
    if missing:
        # dict.values: a hint is not worth reading entries a reader deferred.
        bare = bool(checkpoint) and all(isinstance(value, torch.Tensor) for value in dict.values(checkpoint))
        hint = " (a bare state dict? load it with module.load_state_dict(torch.load(path)))" if bare else ""
        raise CheckpointError(
            f"{str(path)!r} is not a stratagem checkpoint: it lacks {', '.join(map(repr, missing))}; it holds "
            f"{_describe(checkpoint)}{hint}."
        )
    return checkpoint


def _describe(value: object) -> str:
    if isinstance(value, dict):
        keys = [shown_repr(key, 80) for key in list(value)[:8]]
        more = f", ... ({len(value)} in all)" if len(value) > len(keys) else ""
        return f"a dict with keys {', '.join(keys)}{more}" if keys else "an empty dict"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)} item{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


def _reader_of(target: Path, preferred: CheckpointIO) -> CheckpointIO:
    if type(preferred).can_read(target):
        return preferred
    from stratagem.registry import checkpoint_io as registered

    skipped = []
    for name in registered.names():
        try:
            reader_class = registered.load_target(name)
        except Exception as error:  # one broken reader must not stop the others from loading
            skipped.append(f"{name} ({type(error).__name__}: {printable(error, 300)})")
            continue
        if not (isinstance(reader_class, type) and issubclass(reader_class, CheckpointIO)):
            continue
        if reader_class.can_read(target):
            created: CheckpointIO = registered.create(name)
            return created
    known = ", ".join(registered.names()) or "none"
    unusable = f" Could not use: {'; '.join(skipped)}." if skipped else ""
    raise CheckpointError(
        f"No installed checkpoint IO recognises {str(target)!r} (asked: {known}).{unusable} A directory of shards "
        'needs the package of the strategy that wrote it (e.g. pip install "stratagem[fsdp]").'
    )
