"""The mesh layouts a world size allows: every way to divide the ranks over the dimensions a strategy sizes."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

LAYOUT_DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "tp")
"""Every dimension a layout may have, outermost first: pipeline stages outermost and tensor parallelism innermost
(its ranks neighbours, on one node), as :mod:`stratagem.mesh` and torchtitan order them. A strategy sizes some of
them (:attr:`stratagem.strategies.LayoutSharding.dimensions`); the others are 1."""

INNER_NODE_ONLY = ("tp",)
"""Dimensions whose groups must stay within one node: tensor parallelism's collectives sit on every layer's
critical path, so it is not planned across the slower network."""

Layout = dict[str, int]


def layouts_for(dimensions: Sequence[str], world_size: int, devices_per_node: int) -> list[Layout]:
    """Every layout over ``dimensions`` whose sizes multiply to ``world_size``, in a stable order; a dimension
    of :data:`INNER_NODE_ONLY` divides ``devices_per_node``."""
    sized = [name for name in LAYOUT_DIMENSIONS if name in dimensions]
    unknown = sorted(set(dimensions) - set(LAYOUT_DIMENSIONS))
    if unknown:
        raise ValueError(f"mesh dimensions {unknown} are not planned; known: {', '.join(LAYOUT_DIMENSIONS)}")
    layouts = []
    for sizes in _factorizations(world_size, len(sized)):
        layout = complete(dict(zip(sized, sizes, strict=True)))
        if all(devices_per_node % layout[name] == 0 for name in INNER_NODE_ONLY):
            layouts.append(layout)
    return layouts


def complete(layout: Mapping[str, int]) -> Layout:
    """``layout`` with every dimension of :data:`LAYOUT_DIMENSIONS`, the missing ones 1."""
    return {name: int(layout.get(name, 1)) for name in LAYOUT_DIMENSIONS}


def resolved(layout: Mapping[str, int], world_size: int) -> Layout:
    """``layout`` with its ``-1`` dimension given the ranks the others leave; ``ValueError`` when the sizes do not
    fill ``world_size``."""
    sizes = complete(layout)
    given = math.prod(size for size in sizes.values() if size != -1)
    rest = [name for name, size in sizes.items() if size == -1]
    if rest and world_size % given == 0:
        sizes[rest[0]] = world_size // given
        return sizes
    if not rest and given == world_size:
        return sizes
    raise ValueError(f"the layout {text(sizes)} does not fill {world_size} ranks")


def group_within_node(layout: Mapping[str, int], dimension: str, devices_per_node: int) -> bool:
    """Whether each group of ``dimension`` lies on one node: ranks are numbered innermost dimension fastest, so a
    group spans its size times the sizes of the dimensions inside it."""
    inner = LAYOUT_DIMENSIONS[LAYOUT_DIMENSIONS.index(dimension) + 1 :]
    span = layout[dimension] * math.prod(layout[name] for name in inner)
    return span <= devices_per_node


def coordinates(layout: Mapping[str, int], rank: int) -> Layout:
    """The position of global ``rank`` on each dimension."""
    position: Layout = {}
    for name in reversed(LAYOUT_DIMENSIONS):
        position[name] = rank % layout[name]
        rank //= layout[name]
    return {name: position[name] for name in LAYOUT_DIMENSIONS}


def text(layout: Mapping[str, int]) -> str:
    """``dp_shard=128 tp=8``: the dimensions larger than 1 (``dp_shard=1`` for a single rank)."""
    shown = [f"{name}={size}" for name, size in layout.items() if size != 1]
    return " ".join(shown) or "dp_shard=1"


def _factorizations(number: int, parts: int) -> Iterator[tuple[int, ...]]:
    if parts == 0:
        if number == 1:
            yield ()
        return
    if parts == 1:
        yield (number,)
        return
    for first in _divisors(number):
        for rest in _factorizations(number // first, parts - 1):
            yield (first, *rest)


def _divisors(number: int) -> list[int]:
    return [candidate for candidate in range(1, number + 1) if number % candidate == 0]
