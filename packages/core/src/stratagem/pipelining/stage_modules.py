"""A module reduced to the pipeline stages one rank holds, with rank 0's values, and a module per stage.

A rank keeps, in the user's own module object, only the pieces of its stages (see :mod:`.split`): what
belongs to other stages is set to ``None`` and the block list becomes a :class:`StageBlocks` holding the
kept blocks under their original indices. Parameter names therefore stay those of the whole model
(``layers.5.attention.weight``), so that checkpoints of every stage together are the whole model's, and
the optimizer made from ``module.parameters()`` steps exactly this rank's parameters.

Each stage then runs a *view*: a shallow copy of the module (and of its holders down to the block list)
that shares the kept submodules and holds only that stage's pieces. The view's ``forward`` is the user's,
which skips what is ``None`` (``if self.embed is not None: ...``) and loops over the blocks it holds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from stratagem.pipelining.split import StageSplit


class StageBlocks(nn.ModuleList):
    """Some consecutive blocks of a list, kept under their indices in the whole list.

    Iterating, ``len`` and indexing by position see only the kept blocks; parameter names keep the whole
    list's indices.
    """

    def __init__(self, blocks: dict[str, nn.Module]) -> None:
        super().__init__()
        for index, block in blocks.items():
            self.add_module(index, block)

    def __getitem__(self, index: int | slice) -> nn.Module:  # type: ignore[override]
        blocks = list(self._modules.items())
        if isinstance(index, slice):
            return StageBlocks(dict(blocks[index]))  # type: ignore[arg-type]
        return blocks[index][1]  # type: ignore[return-value]


def stage_pieces(split: StageSplit, stages: list[int]) -> set[str]:
    return {piece for stage in stages for piece in split.pieces(stage)}


def keep_stages(module: nn.Module, split: StageSplit, stages: list[int]) -> None:
    """Reduce ``module`` in place to the pieces of ``stages``."""
    _pruned(module, split, stages, copy_holders=False)


def stage_view(module: nn.Module, split: StageSplit, stage: int) -> nn.Module:
    """A shallow copy of ``module`` (already reduced by :func:`keep_stages`) holding stage ``stage``'s pieces."""
    return _pruned(module, split, [stage], copy_holders=True)


def holder_pairs(module: nn.Module, view: nn.Module, split: StageSplit) -> Iterator[tuple[nn.Module, nn.Module]]:
    """The module's holders on the way to the block list, each with the view's copy of it."""
    yield module, view
    for part in split.blocks.split(".")[:-1]:
        module, view = module._modules[part], view._modules[part]  # type: ignore[assignment]
        yield module, view


def _pruned(module: nn.Module, split: StageSplit, stages: list[int], copy_holders: bool) -> nn.Module:
    keep = stage_pieces(split, stages)
    kept_blocks = sorted(index for stage in stages for index in split.stage_blocks[stage])
    parts = split.blocks.split(".")

    def prune(holder: nn.Module, depth: int, prefix: str) -> nn.Module:
        if copy_holders:
            holder = copy.copy(holder)
            for attribute in ("_modules", "_parameters", "_buffers"):
                holder.__dict__[attribute] = dict(holder.__dict__[attribute])
        tensors: dict[str, torch.Tensor | None]
        for tensors in (holder._parameters, holder._buffers):  # type: ignore[assignment]
            for name, tensor in tensors.items():
                if tensor is not None and prefix + name not in keep:
                    tensors[name] = None
        part = parts[depth]
        for name, child in holder._modules.items():
            if name != part and child is not None and prefix + name not in keep:
                holder._modules[name] = None
        child = holder._modules[part]
        assert child is not None
        if depth == len(parts) - 1:
            holder._modules[part] = StageBlocks({str(index): child._modules[str(index)] for index in kept_blocks})  # type: ignore[misc]
        else:
            holder._modules[part] = prune(child, depth + 1, prefix + part + ".")
        return holder

    return prune(module, 0, "")


def _named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(), *module.named_buffers()]


def hand_out_stages(
    module: nn.Module,
    split: StageSplit,
    stages_of_rank: Callable[[int], list[int]],
    device: torch.device,
) -> None:
    """Reduce every rank's ``module`` to its stages, each with global rank 0's values.

    Rank 0 holds the whole module with values (built eagerly, as one process would build it); the other
    ranks may hold it on the meta device. Each other rank keeps its pieces, allocates them on ``device``
    and receives rank 0's values for them, one tensor at a time in the module's order; rank 0 sends them
    before reducing its own module. With one process the module is only reduced.
    """
    distributed = dist.is_available() and dist.is_initialized()
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if rank == 0:
        tensors = dict(_named_tensors(module))
        for destination in range(1, world_size):
            for name in _names_in(tensors, stage_pieces(split, stages_of_rank(destination))):
                dist.send(tensors[name].detach().to(device).contiguous(), dst=destination)
        keep_stages(module, split, stages_of_rank(0))
        return
    keep_stages(module, split, stages_of_rank(rank))
    if any(tensor.is_meta for _, tensor in _named_tensors(module)):
        module.to_empty(device=device)
    own = dict(_named_tensors(module))
    with torch.no_grad():
        for name in _names_in(own, stage_pieces(split, stages_of_rank(rank))):
            received = torch.empty_like(own[name], device=device)
            dist.recv(received, src=0)
            own[name].copy_(received)


def _names_in(tensors: dict[str, torch.Tensor], pieces: set[str]) -> list[str]:
    """The names of ``tensors`` under ``pieces``, in the module's order."""
    return [name for name in tensors if any(name == piece or name.startswith(piece + ".") for piece in pieces)]
