"""Giving a module built on the meta device real memory after it was sharded: each rank allocates its shards.

The values come afterwards, from rank 0 (:class:`stratagem_fsdp.rank_zero_init.RankZeroValues`) or from a
checkpoint; nothing here initialises.
"""

from __future__ import annotations

import torch
from torch import nn


def has_meta_tensors(module: nn.Module) -> bool:
    return any(tensor.is_meta for tensor in (*module.parameters(), *module.buffers()))


def allocate(module: nn.Module, storage_device: torch.device, compute_device: torch.device) -> None:
    """Allocate ``module``'s tensors: sharded parameters on ``storage_device`` (the CPU when offloading),
    buffers on ``compute_device``, since only the shards are offloaded and buffers take part in compute."""
    module.to_empty(device=storage_device)
    if storage_device != compute_device:
        for submodule in module.modules():
            for buffer_name, buffer in submodule.named_buffers(recurse=False):
                submodule._buffers[buffer_name] = buffer.to(compute_device)
