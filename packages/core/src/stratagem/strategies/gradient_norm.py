"""Clipping gradients by their total norm when they are distributed tensors, on one mesh or several.

With tensor parallelism under ``fully_shard`` a model's gradients live on different meshes: those of
split layers on the (data, tensor) mesh, the others on the data submesh. Torch's norm of a list stacks
the per-tensor norms, which only works for tensors placed alike. Here each group placed alike is reduced
on its own mesh, and the groups' norms combined: the norm of the whole gradient, as one process would
compute it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch


def has_distributed_tensors(tensors: Iterable[Any]) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(tensor, DTensor) for tensor in tensors)


def _placed_alike(parameters: Sequence[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """``parameters`` with gradients, grouped by where their gradients live (a mesh and placements, or a device)."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[torch.nn.Parameter]] = {}
    for parameter in parameters:
        gradient = parameter.grad
        if gradient is None:
            continue
        key = (gradient.device_mesh, gradient.placements) if isinstance(gradient, DTensor) else gradient.device
        groups.setdefault(key, []).append(parameter)
    return list(groups.values())


def _total_norm(groups: list[list[torch.nn.Parameter]], norm_type: float) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    norms = []
    for group in groups:
        gradients = [parameter.grad for parameter in group if parameter.grad is not None]
        norm = torch.nn.utils.get_total_norm(gradients, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    device = norms[0].device if norms else torch.device("cpu")
    return torch.nn.utils.get_total_norm([norm.to(device) for norm in norms], norm_type)


def clip_gradients_by_norm(
    parameters: Sequence[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0, split_over: Any = None
) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so that their total norm is at most ``max_norm``; return that norm
    (a plain tensor, the same on every rank). ``split_over`` is a process group whose ranks each hold other
    parameters of the model (pipeline stages): the norm is then the whole model's, combined over it."""
    groups = _placed_alike(parameters)
    norm = _total_norm(groups, norm_type)
    if split_over is not None:
        import torch.distributed as dist

        if math.isinf(norm_type):
            norm = norm.clone()
            dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=split_over)
        else:
            powered = norm.double() ** norm_type
            dist.all_reduce(powered, group=split_over)
            norm = (powered ** (1.0 / norm_type)).to(norm.dtype)
    # Scaled group by group too: one in-place multiply cannot take tensors on different meshes.
    for group in groups:
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm
