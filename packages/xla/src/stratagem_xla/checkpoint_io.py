"""Checkpoints written with ``xm.save``'s semantics: every tensor moved to the CPU first, one file, one writer."""

from __future__ import annotations

from typing import Any

import torch

from stratagem.checkpoint_io import PathLike, TorchCheckpointIO


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
