"""Reading a checkpoint whatever strategy wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratagem.checkpoint_io.checkpoint_io import CheckpointIO, PathLike


def read_full_checkpoint(path: PathLike, preferred: CheckpointIO, weights_only: bool = True) -> dict[str, Any]:
    """Read the whole checkpoint at ``path`` into memory as plain state.

    ``preferred`` (the running strategy's IO) reads it if it recognises the layout; otherwise
    every registered checkpoint IO is asked (:meth:`CheckpointIO.can_read`), so a directory of
    shards written by one strategy loads into another.
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"No checkpoint at {str(target)!r}.")
    if type(preferred).can_read(target):
        return preferred.load_checkpoint(target, weights_only=weights_only)
    from stratagem.registry import checkpoint_io as registered

    skipped = []
    for name in registered.names():
        try:
            reader_class = registered.load_target(name)
        except Exception as error:  # one broken reader must not stop the others from loading
            skipped.append(f"{name} ({type(error).__name__}: {error})")
            continue
        if not (isinstance(reader_class, type) and issubclass(reader_class, CheckpointIO)):
            continue
        if reader_class.can_read(target):
            return registered.create(name).load_checkpoint(target, weights_only=weights_only)
    known = ", ".join(registered.names()) or "none"
    unusable = f" Could not use: {'; '.join(skipped)}." if skipped else ""
    raise ValueError(
        f"No installed checkpoint IO recognises {str(target)!r} (asked: {known}).{unusable} A directory of shards "
        'needs the package of the strategy that wrote it (e.g. pip install "stratagem[fsdp]").'
    )
