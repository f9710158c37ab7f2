"""Partitioning a module that rank 0 built eagerly and the other ranks on the meta device (ZeRO stage 3).

Built inside ``zero.Init``, every submodule's parameters are partitioned as soon as its constructor returns,
so whatever initialises them afterwards (Hugging Face's ``post_init``, an ``nn.init`` call in
``configure_model``) writes into empty partitions and the weights stay those of the layers' own defaults.
Built eagerly on rank 0 instead (:mod:`stratagem.strategies.rank_zero_build`), the module holds the eager
build's values; :func:`partition_from_rank_zero` gives each parameter memory on the other ranks, sends it
rank 0's values and partitions it, one submodule at a time, so that no other rank holds the whole model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def partition_from_rank_zero(module: nn.Module, zero_init: Any, device: torch.device) -> None:
    """Partition ``module``'s parameters with ``zero_init`` (a ``deepspeed.zero.Init``, not entered) and give
    every rank rank 0's buffers; ``device`` is where collectives run."""
    for submodule in module.modules():
        own = [parameter for parameter in submodule.parameters(recurse=False) if not hasattr(parameter, "ds_id")]
        for parameter in own:
            if parameter.is_meta:
                # Swapped in place, not replaced: weights tied to this Parameter object stay tied.
                allocated = nn.Parameter(torch.empty_like(parameter, device="cpu"), parameter.requires_grad)
                torch.utils.swap_tensors(parameter, allocated)
            if parameter.is_floating_point():
                # The dtype zero.Init gives the parameters it creates (the config's fp16/bf16 section).
                parameter.data = parameter.data.to(zero_init.dtype)
        # What zero.Init(module=...) does for a whole module: broadcast from rank 0, then partition.
        zero_init._convert_to_zero_parameters(own)
    with torch.no_grad():
        for submodule in module.modules():
            for name, buffer in submodule._buffers.items():
                if buffer is None:
                    continue
                carried = (
                    torch.empty_like(buffer, device=device) if buffer.is_meta else buffer.detach().to(device, copy=True)
                )
                if dist.is_initialized() and dist.get_world_size() > 1:
                    dist.broadcast(carried, src=0)
                submodule._buffers[name] = carried.to(buffer.device if not buffer.is_meta else "cpu")
