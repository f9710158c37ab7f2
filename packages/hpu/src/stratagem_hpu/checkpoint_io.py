"""HPUCheckpointIO: checkpoints written from host memory, loadable by every other strategy."""

from __future__ import annotations

from typing import Any

import torch

from stratagem.checkpoint_io import PathLike, TorchCheckpointIO


class HPUCheckpointIO(TorchCheckpointIO):
    """One ``torch.save`` file, as :class:`TorchCheckpointIO` writes it, with every tensor moved to the CPU first
    (a file holding ``hpu`` tensors loads only where Habana's bridge is)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        super().save_checkpoint(_on_cpu(checkpoint), path)


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_on_cpu(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_on_cpu(item) for item in value)
    return value
