"""Where a module is cut into pipeline stages: the blocks of one ``nn.ModuleList``, the rest to the ends.

A module is cut along one list of blocks (a decoder's ``layers``): each stage holds a run of consecutive
blocks. What the module holds beside the blocks goes to an end of the pipeline by where it is declared:
submodules declared before the block list (token and position embeddings) go to the first stage, those
declared after it (the final norm, the head) to the last, and tensors held directly (a learned position
table) to the first. Where the block list sits deeper (``model.layers``), the same rule holds at every
level on the way down.

The cut is decided from the module's structure only, so it works on a module built on the meta device and
can be checked in the calling process before any process starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

_SHOWN = 6


@dataclass(frozen=True)
class StageSplit:
    """How a module's pieces are divided over ``num_stages`` pipeline stages."""

    blocks: str
    """The dotted name of the block list the module is cut along (``"layers"``)."""
    block_count: int
    stage_blocks: tuple[tuple[int, ...], ...]
    """The indices of the blocks each stage holds, stage 0 first."""
    leading: tuple[str, ...]
    """Dotted names of what goes to the first stage beside its blocks (submodules and tensors)."""
    trailing: tuple[str, ...]
    """Dotted names of the submodules that go to the last stage beside its blocks."""

    @property
    def num_stages(self) -> int:
        return len(self.stage_blocks)

    def pieces(self, stage: int) -> list[str]:
        """The dotted names of the submodules and tensors stage ``stage`` holds."""
        pieces = [f"{self.blocks}.{index}" for index in self.stage_blocks[stage]]
        if stage == 0:
            pieces = [*self.leading, *pieces]
        if stage == self.num_stages - 1:
            pieces = [*pieces, *self.trailing]
        return pieces

    def split_points(self) -> list[str]:
        """The first block of every stage after the first, as ``pipeline_split=`` spells them."""
        return [f"{self.blocks}.{blocks[0]}" for blocks in self.stage_blocks[1:]]


def split_module(
    module: nn.Module, num_stages: int, split_points: Sequence[str] | None = None, blocks: str | None = None
) -> StageSplit:
    """Cut ``module`` into ``num_stages`` stages, at ``split_points`` or with the blocks divided evenly.

    ``split_points`` names the first block of every stage after the first (``["layers.4"]`` for two
    stages); without it each stage gets ``block_count // num_stages`` blocks, the first ones one more
    while some are left. ``blocks`` names the block list; by default it is the one in the split points,
    else the module's largest ``nn.ModuleList``. Raises ``ValueError`` naming what does not fit.
    """
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages={num_stages!r} is not valid; expected a positive int.")
    if split_points is not None:
        split_points = _checked_split_points(split_points, num_stages)
        blocks = _blocks_of_split_points(module, split_points, blocks)
    name = blocks if blocks is not None else _largest_module_list(module)
    container = _block_list(module, name)
    count = len(container)
    if count < num_stages:
        raise ValueError(
            f"The pipeline has {num_stages} stages but {name!r} holds {count} block(s): each stage needs at least "
            f"one. Use at most {count} stages (pp x stages per rank), or a model with more blocks."
        )
    starts = _stage_starts(name, count, num_stages, split_points)
    bounds = [*starts, count]
    stage_blocks = tuple(tuple(range(bounds[stage], bounds[stage + 1])) for stage in range(num_stages))
    leading, trailing = _ends(module, name)
    split = StageSplit(name, count, stage_blocks, leading, trailing)
    _refuse_tensors_shared_across_stages(module, split)
    return split


def _checked_split_points(split_points: Sequence[str], num_stages: int) -> list[str]:
    if isinstance(split_points, str) or not all(isinstance(point, str) for point in split_points):
        raise TypeError(
            f"pipeline_split={split_points!r} is not valid; expected a list of block names such as ['layers.4']."
        )
    points = list(split_points)
    if len(points) != num_stages - 1:
        raise ValueError(
            f"pipeline_split={points!r} cuts the model into {len(points) + 1} stages, but the pipeline has "
            f"{num_stages} (pp x stages per rank): give {num_stages - 1} split point(s), the first block of "
            "every stage after the first."
        )
    return points


def _blocks_of_split_points(module: nn.Module, split_points: list[str], blocks: str | None) -> str:
    """The one block list every split point names a block of."""
    containers = set()
    for point in split_points:
        container, _, index = point.rpartition(".")
        if not container or not index.isdigit():
            raise ValueError(
                f"pipeline_split names {point!r}, which is not a block of a list of blocks; expected the list's name "
                "and the block's index, such as 'layers.4'."
            )
        containers.add(container)
    if blocks is not None:
        containers.add(blocks)
    if len(containers) > 1:
        raise ValueError(
            f"pipeline_split names blocks of {sorted(containers)}; a pipeline is cut along one list of blocks."
        )
    return containers.pop()


def _stage_starts(name: str, count: int, num_stages: int, split_points: list[str] | None) -> list[int]:
    if split_points is None:
        per_stage, extra = divmod(count, num_stages)
        sizes = [per_stage + (1 if stage < extra else 0) for stage in range(num_stages)]
        return [sum(sizes[:stage]) for stage in range(num_stages)]
    starts = [0]
    for point in split_points:
        index = int(point.rpartition(".")[2])
        if index >= count:
            raise ValueError(
                f"pipeline_split names {point!r}, which does not exist: {name!r} holds blocks {name}.0 to "
                f"{name}.{count - 1}."
            )
        if index <= starts[-1]:
            raise ValueError(
                f"pipeline_split={split_points!r} leaves a stage without blocks at {point!r}: split points must "
                f"name blocks in increasing order, after {name}.0."
            )
        starts.append(index)
    return starts


def _block_list(module: nn.Module, name: str) -> nn.ModuleList:
    try:
        container = module.get_submodule(name)
    except AttributeError:
        raise ValueError(
            f"The pipeline's blocks {name!r} do not exist in {type(module).__name__}; its lists of blocks are "
            f"{_module_lists(module)[:_SHOWN] or 'none'}."
        ) from None
    if not isinstance(container, nn.ModuleList):
        raise ValueError(
            f"The pipeline's blocks {name!r} are a {type(container).__name__}, not an nn.ModuleList; a pipeline is "
            f"cut along a list of blocks. {type(module).__name__}'s lists: {_module_lists(module)[:_SHOWN] or 'none'}."
        )
    return container


def _module_lists(module: nn.Module) -> list[str]:
    return [name for name, child in module.named_modules() if name and isinstance(child, nn.ModuleList)]


def _largest_module_list(module: nn.Module) -> str:
    lists = [(len(module.get_submodule(name)._modules), name) for name in _module_lists(module)]
    if not lists:
        raise ValueError(
            f"{type(module).__name__} holds no nn.ModuleList of blocks to cut into pipeline stages. Keep the "
            "repeated blocks in an nn.ModuleList, or name them with pipeline_split=['<list>.<index>', ...]."
        )
    return max(lists, key=lambda entry: entry[0])[1]


def _ends(module: nn.Module, blocks: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What goes to the first stage and what to the last, walking from the root down to the block list."""
    leading: list[str] = []
    trailing: list[str] = []
    holder = module
    prefix = ""
    for part in blocks.split("."):
        leading += [prefix + name for name, _ in _direct_tensors(holder)]
        names = list(holder._modules)
        position = names.index(part)
        leading += [prefix + name for name in names[:position] if holder._modules[name] is not None]
        trailing[:0] = [prefix + name for name in names[position + 1 :] if holder._modules[name] is not None]
        holder = holder._modules[part]  # type: ignore[assignment]
        prefix += part + "."
    return tuple(leading), tuple(trailing)


def _direct_tensors(module: nn.Module) -> list[tuple[str, object]]:
    return [
        (name, tensor) for name, tensor in (*module._parameters.items(), *module._buffers.items()) if tensor is not None
    ]


def _refuse_tensors_shared_across_stages(module: nn.Module, split: StageSplit) -> None:
    """A tensor two stages share (an embedding tied to the head) would train as two copies, apart."""
    first_stage: dict[int, tuple[int, str]] = {}
    for stage in range(split.num_stages):
        for piece in split.pieces(stage):
            for name, tensor in _tensors_of(module, piece):
                seen = first_stage.setdefault(id(tensor), (stage, name))
                if seen[0] != stage:
                    raise ValueError(
                        f"{name!r} (stage {stage}) is the same tensor as {seen[1]!r} (stage {seen[0]}): tied weights "
                        "cannot be split over pipeline stages, each stage would train its own copy. Untie them, or "
                        "cut the pipeline so that both fall in one stage."
                    )


def _tensors_of(module: nn.Module, piece: str) -> list[tuple[str, object]]:
    holder_name, _, attribute = piece.rpartition(".")
    holder = module.get_submodule(holder_name)
    child = holder._modules.get(attribute)
    if child is None:
        tensor = holder._parameters.get(attribute, holder._buffers.get(attribute))
        return [] if tensor is None else [(piece, tensor)]
    return [
        (f"{piece}.{name}", tensor)
        for name, tensor in (
            *child.named_parameters(remove_duplicate=False),
            *child.named_buffers(remove_duplicate=False),
        )
    ]
