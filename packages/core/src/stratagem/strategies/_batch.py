from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to ``device``; other values pass through."""
    return device_mover(device)(batch)


@functools.lru_cache(maxsize=8)
def device_mover(device: torch.device) -> Callable[[Any], Any]:
    """:func:`move_to_device` to ``device`` as one callable, for a loop that moves every batch to the same device
    (made once per device: ``move_to_device`` is called per batch by strategies that override the step calls)."""
    non_blocking = device.type == "cuda"
    # ``.device`` builds a device object per tensor; a CPU tensor says where it is without one. A tensor already
    # on the device is returned as it is by ``.to`` as well, so a batch passed through unchanged is the same.
    on_cpu = device.type == "cpu"

    def move_tensor(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device != device:
            return value.to(device, non_blocking=non_blocking)
        return value

    def move(batch: Any) -> Any:
        if type(batch) in (tuple, list):
            # The common (inputs, targets) batch already in place: skip the pytree walk, which
            # costs more per step than the rest of the Trainer's own work on small models
            # (a plain loop: a generator in all() costs a few microseconds more per step).
            for value in batch:
                if not isinstance(value, torch.Tensor) or not (value.is_cpu if on_cpu else value.device == device):
                    break
            else:
                return batch
        if isinstance(batch, torch.Tensor):
            return move_tensor(batch)
        return tree_map(move_tensor, batch)

    return move
