"""A declarative tensor-parallel plan, and the check that tensor parallelism splits attention heads evenly.

A plan maps module name patterns to how each matched module's tensors are split over the ``"tp"``
submesh, as Hugging Face's ``tp_plan`` does: ``{"layers.*.attn.q": "colwise", "layers.*.attn.out":
"rowwise"}``. A pattern's dot-separated parts match the parts of a module's name one by one, each
with shell wildcards (``*``, ``?``, ``[...]``), as torch's ``parallelize_module`` matches them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

STYLES: dict[str, type[ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "sequence_parallel": SequenceParallel,
}
"""The names a plan may give, and the torch style each stands for (with its default arguments)."""

TensorParallelPlan = Mapping[str, str | ParallelStyle]

HEAD_COUNTS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "num_key_value_heads")
"""Attributes by which an attention module (or the ``config`` it holds) declares how many heads it has."""


def check_tp_plan(plan: object) -> dict[str, str | ParallelStyle]:
    """``plan`` as a dict if it maps non-empty names to a style name of :data:`STYLES` or a ``ParallelStyle``;
    otherwise a ``TypeError``/``ValueError`` naming the entry and what is accepted."""
    if not isinstance(plan, Mapping) or not plan:
        raise TypeError(
            f"tp_plan={plan!r} is not a tensor-parallel plan; expected a non-empty dict of module name patterns to "
            f"one of {sorted(STYLES)} or a torch ParallelStyle, e.g. {{'layers.*.attn.q': 'colwise'}}."
        )
    for pattern, style in plan.items():
        if not isinstance(pattern, str) or not pattern or "" in pattern.split("."):
            raise ValueError(
                f"tp_plan has the key {pattern!r}; expected a module name pattern such as 'layers.*.attn.q'."
            )
        if not (isinstance(style, ParallelStyle) or (isinstance(style, str) and style in STYLES)):
            raise ValueError(
                f"tp_plan[{pattern!r}] = {style!r} is not a tensor-parallel style; expected one of {sorted(STYLES)} "
                "or a torch ParallelStyle (ColwiseParallel(), RowwiseParallel(...), ...)."
            )
    return dict(plan)


def apply_tp_plan(module: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, str | ParallelStyle]) -> None:
    """Split the modules ``plan`` names over ``tp_mesh``; a ``ValueError`` naming every pattern that matches no
    module, before anything is split. Over one rank nothing is split: the modules stay as they are."""
    check_plan_matches(module, plan)
    if tp_mesh.size() == 1:
        return
    styles = {pattern: STYLES[style]() if isinstance(style, str) else style for pattern, style in plan.items()}
    parallelize_module(module, tp_mesh, styles)


def plan_entries_present(module: nn.Module, plan: Mapping[str, str | ParallelStyle]) -> dict[str, str | ParallelStyle]:
    """The entries of ``plan`` that match some module of ``module``: a pipeline rank's part of a plan made for
    the whole model (``"head"`` matches only on the last stage)."""
    names = [name for name, _ in module.named_modules() if name]
    return {pattern: style for pattern, style in plan.items() if any(_matches(pattern, name) for name in names)}


def check_plan_matches(module: nn.Module, plan: Mapping[str, str | ParallelStyle]) -> None:
    """A ``ValueError`` naming every pattern of ``plan`` that matches no module of ``module``."""
    names = [name for name, _ in module.named_modules() if name]
    unmatched = [pattern for pattern in plan if not any(_matches(pattern, name) for name in names)]
    if unmatched:
        raise ValueError(
            f"tp_plan names {', '.join(map(repr, unmatched))}, which match{'es' if len(unmatched) == 1 else ''} no "
            f"module of {type(module).__name__} (its modules include {', '.join(map(repr, names[:8]))}"
            f"{', ...' if len(names) > 8 else ''}). A pattern's dot-separated parts match a module name's parts one "
            "by one, '*' standing for one part (e.g. 'layers.*.attn.q')."
        )


def check_heads_split_evenly(module: nn.Module, tp: int) -> None:
    """A ``ValueError`` naming the module and both sizes when ``tp`` does not divide the heads of an attention
    module whose tensors are split over the ``"tp"`` dimension (a split head would mix heads' values)."""
    if tp == 1:
        return
    for name, submodule in module.named_modules():
        counts = dict(_declared_head_counts(submodule))
        uneven = {attribute: count for attribute, count in counts.items() if count % tp}
        if uneven and _split_over_tp(submodule):
            attribute, count = next(iter(uneven.items()))
            divisors = [size for size in range(1, count + 1) if count % size == 0]
            raise ValueError(
                f"tp={tp} does not divide the attention heads of {name or type(module).__name__!r} ({attribute}="
                f"{count}): each tensor-parallel rank must hold whole heads. Use a tp that divides {count} "
                f"({', '.join(map(str, divisors))})."
            )


def check_declared_heads(num_heads: tuple[int, ...], tp: int) -> None:
    """The calling process's check of :func:`check_heads_split_evenly`, for heads the user declared."""
    for count in num_heads:
        if count % tp:
            divisors = [size for size in range(1, count + 1) if count % size == 0]
            raise ValueError(
                f"tp={tp} does not divide num_heads={count}: each tensor-parallel rank must hold whole heads. Use a "
                f"tp that divides {count} ({', '.join(map(str, divisors))})."
            )


def check_num_heads(num_heads: object) -> tuple[int, ...]:
    """``num_heads`` (an int, or a tuple such as attention and key/value heads) as a tuple of positive ints."""
    counts = num_heads if isinstance(num_heads, tuple | list) else (num_heads,)
    if not counts or not all(isinstance(count, int) and not isinstance(count, bool) and count > 0 for count in counts):
        raise ValueError(
            f"num_heads={num_heads!r} is not a head count; expected a positive int, or a tuple of them (attention "
            "and key/value heads)."
        )
    return tuple(counts)


def _matches(pattern: str, name: str) -> bool:
    parts, atoms = name.split("."), pattern.split(".")
    return len(parts) == len(atoms) and all(fnmatchcase(part, atom) for part, atom in zip(parts, atoms))


def _declared_head_counts(module: nn.Module) -> Iterator[tuple[str, int]]:
    # Only the module's own attributes: nn.Module.__getattr__ would look among its children too.
    sources: list[Any] = [vars(module)]
    config = vars(module).get("config")
    if config is not None:
        sources.append(getattr(config, "__dict__", {}))
    for source in sources:
        for attribute in HEAD_COUNTS:
            value = source.get(attribute)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                yield attribute, value


def _split_over_tp(module: nn.Module) -> bool:
    """Whether the module's own tensors, or its direct children's (an attention's projections), are split over
    ``"tp"``; deeper ones belong to other modules, which declare their own heads if they have any."""
    own = [*module.parameters(recurse=False)]
    children = [parameter for child in module.children() for parameter in child.parameters(recurse=False)]
    for parameter in (*own, *children):
        if isinstance(parameter, DTensor):
            names = parameter.device_mesh.mesh_dim_names or ()
            placements = enumerate(parameter.placements)
            if any(isinstance(placement, Shard) and names[dim] == "tp" for dim, placement in placements):
                return True
    return False
