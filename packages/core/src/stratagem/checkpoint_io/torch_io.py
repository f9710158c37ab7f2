from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io.atomic import move_into_place, remove_stale_temporaries, temporary_sibling
from stratagem.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from stratagem.checkpoint_io.torch_files import load_torch_file


class TorchCheckpointIO(CheckpointIO):
    """One ``torch.save`` file per checkpoint, written atomically.

    The bytes go to a temporary sibling of the target, are fsynced, and the file is
    renamed over the target (a file, a link, or a directory checkpoint of another strategy):
    a crash mid-write leaves the previous checkpoint intact, and what it left under the temporary
    name is removed at a later save (:func:`~stratagem.checkpoint_io.remove_stale_temporaries`).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target.parent)
        temporary = temporary_sibling(target)
        try:
            # Through a file object of ours: torch's own file writer reports a full disk as
            # "unexpected pos 704 vs 598", while a Python stream keeps the OSError as the context.
            with open(temporary, "wb") as stream:
                torch.save(checkpoint, stream)
            # move_into_place fsyncs the finished file before it takes the name.
            move_into_place(temporary, target)
        except BaseException as error:
            temporary.unlink(missing_ok=True)
            system_error = _os_error_behind(error)
            if system_error is not None and system_error is not error:
                raise OSError(
                    system_error.errno, f"Writing the checkpoint {str(target)!r} failed: {system_error.strerror}"
                ) from error
            raise

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: torch.device | str | None = "cpu",
        weights_only: bool = True,
    ) -> dict[str, Any]:
        target = Path(path)
        if not target.is_file():
            raise FileNotFoundError(f"No checkpoint file at {str(target)!r}.")
        return load_torch_file(target, map_location=map_location, weights_only=weights_only)

    @classmethod
    def can_read(cls, path: PathLike) -> bool:
        return Path(path).is_file()


def _os_error_behind(error: BaseException) -> OSError | None:
    """The operating system's error that ``error`` was raised while handling, if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
