"""``habana_frameworks.torch.distributed.hccl``: importing it registers the ``hccl`` process-group backend.

Here ``hccl`` is gloo under Habana's name. It is registered for ``hpu`` tensors (Habana's) and ``cpu``
tensors (the stand-in's cards compute on the CPU).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from habana_frameworks import record


def _create_hccl(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


if "hccl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("hccl", _create_hccl, devices=["hpu", "cpu"])


def initialize_distributed_hpu(world_size: int = -1, rank: int = -1, local_rank: int = -1) -> tuple[int, int, int]:
    """Habana reads the rank variables and prepares the card for HCCL; returns (world size, rank, local rank)."""
    record("initialize_distributed_hpu", world_size=world_size, rank=rank, local_rank=local_rank)
    world_size = world_size if world_size != -1 else int(os.environ.get("WORLD_SIZE", "1"))
    rank = rank if rank != -1 else int(os.environ.get("RANK", "0"))
    local_rank = local_rank if local_rank != -1 else int(os.environ.get("LOCAL_RANK", "0"))
    return world_size, rank, local_rank
