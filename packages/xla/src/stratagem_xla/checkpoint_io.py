"""Checkpoints written with ``xm.save``'s semantics: every tensor moved to the CPU first, one file, one writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io import CheckpointError, PathLike, TorchCheckpointIO, load_torch_file


class XLACheckpointIO(TorchCheckpointIO):
    """One ``torch.save`` file (written atomically, as :class:`~stratagem.checkpoint_io.TorchCheckpointIO`
    writes it) of a checkpoint whose XLA tensors were first copied to the CPU.

    A file holding XLA tensors could be loaded only where torch_xla is; with them on the CPU it is an ordinary
    checkpoint that ``single_device``, ``ddp`` and ``fsdp`` load, and the XLA strategies load theirs the same
    way (the module's ``load_state_dict`` copies the values onto the device). As with ``xm.save``, the copy
    waits for the device's pending work; only global rank 0 writes.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        super().save_checkpoint(to_cpu(checkpoint), path)


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor inside it (dicts, lists, tuples) copied to the CPU, other values kept."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_cpu(item) for item in value]
    if isinstance(value, tuple):
        return tuple(to_cpu(item) for item in value)
    return value


SHARD_FILE = "rank-{rank}-of-{world_size}.pt"


class XLAShardedCheckpointIO(XLACheckpointIO):
    """Reads the directories ``xla_fsdp`` writes with ``state_dict_type="sharded"``: one file per rank
    (``rank-R-of-N.pt``), each holding that rank's parameter shards (``module_shard``), XlaFSDP's shard metadata
    and the rank's optimizer shards; rank 0's also holds the rest of the checkpoint.

    Any strategy (and ``stratagem consolidate``) reads such a directory as one whole checkpoint: the module's
    shards are put together into its plain state dict. The optimizer shards are left out (they fit only XlaFSDP's
    flat shards of the same world size); ``xla_fsdp`` itself resumes from them.
    """

    @classmethod
    def can_read(cls, path: PathLike) -> bool:
        target = Path(path)
        return target.is_dir() and any(target.glob("rank-0-of-*.pt"))

    def load_checkpoint(
        self, path: PathLike, map_location: torch.device | str | None = "cpu", weights_only: bool = True
    ) -> dict[str, Any]:
        from stratagem_xla.shards import whole_state

        files = shard_files(Path(path))
        shards = [load_torch_file(file, map_location="cpu", weights_only=weights_only) for file in files]
        first = shards[0]
        whole = whole_state([shard["module_shard"] for shard in shards], first["shard_metadata"])
        rest = {
            key: value for key, value in first.items() if key not in ("module_shard", "shard_metadata", "optimizers")
        }
        return {**rest, "module": whole}


def shard_files(directory: Path) -> list[Path]:
    """The shard files of a sharded ``xla_fsdp`` checkpoint in rank order; ``CheckpointError`` if one is missing."""
    first = next(iter(sorted(directory.glob("rank-0-of-*.pt"))), None)
    if first is None:
        raise CheckpointError(f"{str(directory)!r} holds no rank-0-of-N.pt: it is not a sharded xla_fsdp checkpoint.")
    world_size = int(first.stem.rsplit("-", 1)[-1])
    files = [directory / SHARD_FILE.format(rank=rank, world_size=world_size) for rank in range(world_size)]
    missing = [file.name for file in files if not file.is_file()]
    if missing:
        raise CheckpointError(f"The sharded xla_fsdp checkpoint {str(directory)!r} lacks {', '.join(missing)}.")
    return files
