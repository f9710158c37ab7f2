"""Giving a module built on the meta device real, initialised memory after it was sharded.

``to_empty`` allocates each rank's shards. Calling ``reset_parameters`` on the sharded
parameters directly would draw the same random numbers on every rank, so every shard of a
weight would hold the same values. Instead each module's own parameters are initialised one
module at a time as whole temporary tensors, every rank drawing from rank 0's random state,
and each rank keeps its shard. The result equals the module rank 0 would have created normally
from its random state, however the other ranks were seeded, and no rank holds more than one
module's whole parameters at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from stratagem_fsdp.rank_zero_init import rank_zero_random_state


def has_meta_tensors(module: nn.Module) -> bool:
    return any(tensor.is_meta for tensor in (*module.parameters(), *module.buffers()))


def materialize(
    module: nn.Module, storage_device: torch.device, compute_device: torch.device, initialise: bool = True
) -> list[str]:
    """Allocate ``module``'s tensors on ``storage_device`` and initialise them; return modules left uninitialised.

    Sharded parameters live on ``storage_device`` (the CPU when offloading); buffers and the
    temporary whole parameters are on ``compute_device``, whose random generator a normal
    creation under the strategy's init context would have used. Modules are initialised
    children first, as constructors that create children and then reset their own
    parameters (``nn.MultiheadAttention``) do. Every rank draws from rank 0's random state
    (see :func:`rank_zero_random_state`). ``initialise=False`` only allocates, for weights that
    a checkpoint will overwrite.
    """
    module.to_empty(device=storage_device)
    if storage_device != compute_device:
        # Only the shards are offloaded; buffers take part in compute.
        for submodule in module.modules():
            for buffer_name, buffer in submodule.named_buffers(recurse=False):
                submodule._buffers[buffer_name] = buffer.to(compute_device)
    if not initialise:
        return []
    uninitialised = []
    with rank_zero_random_state(compute_device):
        for name, submodule in _post_order(module):
            own = [*submodule.parameters(recurse=False), *submodule.buffers(recurse=False)]
            if not own:
                continue
            reset = getattr(submodule, "reset_parameters", None) or getattr(submodule, "_reset_parameters", None)
            if not callable(reset):
                uninitialised.append(name or type(submodule).__name__)
                continue
            with torch.no_grad(), _whole_parameters(submodule, compute_device):
                reset()
    return uninitialised


@contextlib.contextmanager
def _whole_parameters(module: nn.Module, device: torch.device) -> Iterator[None]:
    """Swap ``module``'s sharded parameters for whole temporaries; on exit copy each rank's shard back."""
    swapped: dict[str, tuple[nn.Parameter, nn.Parameter]] = {}
    for name, parameter in module.named_parameters(recurse=False):
        if isinstance(parameter, DTensor):
            whole = nn.Parameter(
                torch.empty(parameter.shape, dtype=parameter.dtype, device=device),
                requires_grad=parameter.requires_grad,
            )
            swapped[name] = (parameter, whole)
            module._parameters[name] = whole
    try:
        yield
    finally:
        for name, (sharded, whole) in swapped.items():
            module._parameters[name] = sharded
            local = cast(DTensor, sharded)
            shard = distribute_tensor(whole.detach(), local.device_mesh, local.placements, src_data_rank=None)
            local.to_local().copy_(shard.to_local())


def _post_order(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    seen: set[int] = set()

    def visit(current: nn.Module, name: str) -> Iterator[tuple[str, nn.Module]]:
        if id(current) in seen:
            return
        seen.add(id(current))
        for child_name, child in current.named_children():
            yield from visit(child, f"{name}.{child_name}" if name else child_name)
        yield name, current

    yield from visit(module, prefix)
