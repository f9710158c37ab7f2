"""Making every rank start from the weights rank 0 would initialise, however each rank was seeded.

Two ways a module reaches ``setup_module``, one tool for each:

- Built normally on every rank: each rank drew its own weights. :func:`broadcast_from_rank_zero`
  copies rank 0's values into every rank's tensors, one tensor at a time, before sharding keeps
  each rank's slice of them.
- Built on the meta device: nothing was drawn yet. Inside :func:`rank_zero_random_state` every
  rank draws from rank 0's random state, so each rank computes the same whole tensors rank 0
  computes and keeps its own slice; nothing is sent but the generator's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def broadcast_from_rank_zero(module: nn.Module, device: torch.device) -> None:
    """Overwrite ``module``'s plain parameters and buffers on every rank with rank 0's values.

    Meta tensors (nothing to send yet) and DTensors (already sharded: rank 0 no longer holds the
    whole tensor) are left alone. ``device`` is where collectives run (the strategy's root
    device); tensors elsewhere travel through one temporary copy at a time.
    """
    if not _is_distributed():
        return
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.is_meta or isinstance(tensor, DTensor):
                continue
            if tensor.device == device:
                dist.broadcast(tensor.detach(), src=0)
                continue
            carried = tensor.detach().to(device)
            dist.broadcast(carried, src=0)
            tensor.copy_(carried)


@contextlib.contextmanager
def rank_zero_random_state(device: torch.device) -> Iterator[None]:
    """Within the block every rank's CPU generator (and ``device``'s) continues from rank 0's state.

    On exit rank 0 keeps the advanced state, as if it had initialised the module alone; every
    other rank gets its own state back, so per-rank randomness (dropout, data order) it was seeded
    for is not replaced by rank 0's.
    """
    if not _is_distributed():
        yield
        return
    devices = [torch.device("cpu")] if device.type == "cpu" else [torch.device("cpu"), device]
    own = [_get_state(each) for each in devices]
    for each, state in zip(devices, own):
        _set_state(each, _from_rank_zero(state, device))
    try:
        yield
    finally:
        if dist.get_rank() != 0:
            for each, state in zip(devices, own):
                _set_state(each, state)


def _from_rank_zero(state: torch.Tensor, device: torch.device) -> torch.Tensor:
    # Generator states of one kind have the same size on every rank, so a tensor broadcast suffices.
    # A copy even on the CPU: the broadcast writes into it, and ``state`` is this rank's to restore.
    carried = state.to(device, copy=True)
    dist.broadcast(carried, src=0)
    return carried.cpu()


def _get_state(device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return torch.get_rng_state()
    return torch.get_device_module(device.type).get_rng_state(device)


def _set_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        torch.get_device_module(device.type).set_rng_state(state, device)
