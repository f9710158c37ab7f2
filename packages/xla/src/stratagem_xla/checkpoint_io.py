"""Checkpoints written with ``xm.save``'s semantics: every tensor moved to the CPU first, one file, one writer."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io import CheckpointError, PathLike, TorchCheckpointIO, checkpoint_file, load_torch_file


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
        from stratagem_xla.shard_checks import checked_shards
        from stratagem_xla.shards import whole_state

        files = shard_files(Path(path))
        shards = [load_torch_file(file, map_location="cpu", weights_only=weights_only) for file in files]
        module_shards, metadata = checked_shards(shards, files)
        whole = whole_state(module_shards, metadata)
        rest = {
            key: value
            for key, value in shards[0].items()
            if key not in ("module_shard", "shard_metadata", "optimizers")
        }
        return {**rest, "module": whole}


_SHARD_NAME = re.compile(r"rank-(0|[1-9][0-9]*)-of-([1-9][0-9]*)\.pt")
_SHOWN = 5


def shard_files(directory: Path) -> list[Path]:
    """The shard files of a sharded ``xla_fsdp`` checkpoint in rank order.

    :class:`CheckpointError` unless the directory holds exactly ``rank-0-of-N.pt`` ... ``rank-(N-1)-of-N.pt``
    as regular files inside it (no other world size's shards, no link leading out of it), so that a stray or
    planted file is never read as one of the shards.
    """
    where = repr(str(directory))
    ranks: dict[int, dict[int, Path]] = {}
    for entry in directory.glob("rank-*-of-*.pt"):
        match = _SHARD_NAME.fullmatch(entry.name)
        if match is None:
            raise CheckpointError(f"{where} holds {entry.name!r}, which is not a shard's name (rank-R-of-N.pt).")
        rank, world_size = int(match.group(1)), int(match.group(2))
        ranks.setdefault(world_size, {})[rank] = entry
    if len(ranks) != 1:
        found = "no rank-0-of-N.pt" if not ranks else f"shards of world sizes {sorted(ranks)}"
        raise CheckpointError(f"{where} holds {found}: it is not one sharded xla_fsdp checkpoint.")
    ((world_size, files),) = ranks.items()
    foreign = sorted(file.name for rank, file in files.items() if rank >= world_size)
    if foreign:
        raise CheckpointError(f"{where} holds {', '.join(foreign[:_SHOWN])}: no such rank in a world of {world_size}.")
    if len(files) != world_size:
        missing = (SHARD_FILE.format(rank=r, world_size=world_size) for r in range(world_size) if r not in files)
        shown = ", ".join(itertools.islice(missing, _SHOWN))
        raise CheckpointError(
            f"The sharded xla_fsdp checkpoint {where} lacks {world_size - len(files)} of its {world_size} shards: "
            f"{shown}{', ...' if world_size - len(files) > _SHOWN else ''}."
        )
    # A link out of the directory, a pipe or a directory in place of a shard is refused before any is opened.
    return [checkpoint_file(directory, files[rank].name) for rank in range(world_size)]
