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
            # move_into_place fsyncs the finished file before it takes the name.
            torch.save(checkpoint, temporary)
            move_into_place(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
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
