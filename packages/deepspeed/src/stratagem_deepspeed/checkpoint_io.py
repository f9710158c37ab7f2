"""DeepSpeed checkpoint directories as plain state, for any strategy and world size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io import (
    CheckpointError,
    CheckpointIO,
    LazyCheckpoint,
    PathLike,
    check_checkpoint,
    load_torch_file,
    move_into_place,
    optional_checkpoint_file,
    temporary_sibling,
)
from stratagem_deepspeed.checkpoint_layout import (
    LATEST_FILE,
    METADATA_KEY,
    STATE_FILE,
    is_deepspeed_checkpoint,
    read_tag,
    removed_on_error,
    write_state_file,
)


class DeepSpeedCheckpointIO(CheckpointIO):
    """Reads a DeepSpeed checkpoint directory as ``{"module": full fp32 state dict, "optimizers":
    [plain optimizer state dict], **plain entries}``, the optimizer state gathered only when taken
    (a :class:`~stratagem.checkpoint_io.LazyCheckpoint`).

    The fp32 master weights and the optimizer state are gathered from the ZeRO shards, so
    ``single_device``, ``ddp``, ``fsdp`` or a DeepSpeed run with another world size can load (and
    resume from) what two DeepSpeed processes saved. Written directly (without the strategy's
    engine), a checkpoint is a directory holding only the plain state, read back the same way.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = temporary_sibling(target)
        temporary.mkdir()
        with removed_on_error(temporary):
            write_state_file(temporary, checkpoint)
            move_into_place(temporary, target)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: torch.device | str | None = "cpu",
        weights_only: bool = True,
    ) -> dict[str, Any]:
        return read_checkpoint(Path(path), map_location=map_location, weights_only=weights_only)

    @classmethod
    def can_read(cls, path: PathLike) -> bool:
        return is_deepspeed_checkpoint(path)


def read_checkpoint(
    directory: Path,
    tag: str | None = None,
    map_location: torch.device | str | None = "cpu",
    weights_only: bool = True,
) -> dict[str, Any]:
    """The whole checkpoint in ``directory`` as plain state (see :class:`DeepSpeedCheckpointIO`).

    With ``weights_only`` every file read is read weights-only (DeepSpeed's own reader, which is not,
    only gets files that passed that check); the directory's ``zero_to_fp32.py`` is never run.
    """
    if not is_deepspeed_checkpoint(directory):
        raise CheckpointError(
            f"{str(directory)!r} is not a DeepSpeed checkpoint directory (no 'latest' file and no {STATE_FILE})."
        )
    checkpoint = LazyCheckpoint.shallow_copy(
        read_state_file(directory, map_location=map_location, weights_only=weights_only)
    )
    metadata = checkpoint.pop(METADATA_KEY, {})
    module_key = metadata.get("module_key", "module")
    tag = tag or read_tag(directory)
    if tag is None and metadata and module_key not in checkpoint:
        raise _missing_latest(directory)
    optimizers_key = metadata.get("optimizers_key")
    if tag is None or (module_key in checkpoint and optimizers_key in (None, *checkpoint)):
        return checkpoint
    from stratagem_deepspeed.shards import (
        check_shard_files,
        gather_fp32_weights,
        gather_optimizer_state,
        has_optimizer_shards,
    )

    check_shard_files(directory, tag, weights_only)
    if module_key not in checkpoint:
        checkpoint[module_key] = _to(gather_fp32_weights(directory, tag), map_location)
    if optimizers_key is not None and optimizers_key not in checkpoint and has_optimizer_shards(directory, tag):
        # Gathering holds every rank's optimizer state at once, and evaluation never takes it.
        checkpoint.defer(optimizers_key, lambda: [gather_optimizer_state(directory, tag)])
    return checkpoint


def _missing_latest(directory: Path) -> CheckpointError:
    """The error for a directory the strategy saved through DeepSpeed's engine whose ``latest`` is gone: the
    module's weights are only in the shards of a tag directory, and nothing says which."""
    tags = sorted(entry.parent.name for entry in directory.glob("*/*model_states.pt"))
    found = f"tag directories with shards: {', '.join(map(repr, dict.fromkeys(tags)))}" if tags else "no shards found"
    return CheckpointError(
        f"{str(directory)!r} lacks its {LATEST_FILE!r} file, which names the tag directory holding the DeepSpeed "
        f"shards (the module's weights are there, not in {STATE_FILE}); {found}. Write the tag's name into "
        f"{str(directory / LATEST_FILE)!r}, or pass tag= to convert_zero_checkpoint_to_fp32_state_dict."
    )


def _to(weights: dict[str, torch.Tensor], map_location: torch.device | str | None) -> dict[str, torch.Tensor]:
    if map_location is None:
        return weights
    return {name: value.to(map_location) for name, value in weights.items()}


def read_state_file(
    directory: Path, map_location: torch.device | str | None = "cpu", weights_only: bool = True
) -> dict[str, Any]:
    """The plain entries stratagem saved beside DeepSpeed's shards (``{}`` for a bare DeepSpeed directory)."""
    path = optional_checkpoint_file(directory, STATE_FILE)
    if path is None:
        return {}
    return dict(check_checkpoint(load_torch_file(path, map_location=map_location, weights_only=weights_only), path))
