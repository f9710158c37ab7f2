"""Checkpoint IO: writing and reading checkpoint state."""

from stratagem.checkpoint_io.atomic import (
    move_into_place,
    remove_stale_temporaries,
    temporary_sibling,
    temporary_siblings,
)
from stratagem.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from stratagem.checkpoint_io.readers import read_full_checkpoint
from stratagem.checkpoint_io.torch_io import TorchCheckpointIO

__all__ = [
    "CheckpointIO",
    "PathLike",
    "TorchCheckpointIO",
    "move_into_place",
    "read_full_checkpoint",
    "remove_stale_temporaries",
    "temporary_sibling",
    "temporary_siblings",
]
