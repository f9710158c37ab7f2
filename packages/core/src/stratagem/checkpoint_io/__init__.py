"""Checkpoint IO: writing and reading checkpoint state."""

from stratagem.checkpoint_io.atomic import (
    move_into_place,
    remove_stale_temporaries,
    temporary_sibling,
    temporary_siblings,
)
from stratagem.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from stratagem.checkpoint_io.confined import (
    checkpoint_file,
    checkpoint_files,
    optional_checkpoint_file,
    regular_file,
)
from stratagem.checkpoint_io.errors import CheckpointError
from stratagem.checkpoint_io.lazy import LazyCheckpoint
from stratagem.checkpoint_io.readers import check_checkpoint, read_full_checkpoint
from stratagem.checkpoint_io.staging import CheckpointRanks, write_staged
from stratagem.checkpoint_io.torch_files import explain_load_failure, load_torch_file
from stratagem.checkpoint_io.torch_io import TorchCheckpointIO

__all__ = [
    "CheckpointError",
    "CheckpointIO",
    "CheckpointRanks",
    "LazyCheckpoint",
    "PathLike",
    "TorchCheckpointIO",
    "check_checkpoint",
    "checkpoint_file",
    "checkpoint_files",
    "explain_load_failure",
    "load_torch_file",
    "move_into_place",
    "optional_checkpoint_file",
    "read_full_checkpoint",
    "regular_file",
    "remove_stale_temporaries",
    "temporary_sibling",
    "temporary_siblings",
    "write_staged",
]
