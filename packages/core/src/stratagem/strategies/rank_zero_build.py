"""Building a sharded strategy's module once, eagerly on rank 0, so that it starts from the eager build's values.

Re-running a module's initialisation on shards cannot reproduce what its construction did in general:
Hugging Face's ``post_init`` re-draws weights after every layer drew its own, ties weights, computes buffers,
and many modules define no ``reset_parameters``. So a sharded strategy does not re-run anything: inside
:func:`rank_zero_build` rank 0 builds the module as an ordinary eager build on one CPU would (same random
draws, same values), while the other ranks build it on the meta device (structure only: no memory, no draws).
The strategy then shards or partitions the module and hands every rank its part of rank 0's values.

What cannot be handed over this way is refused before the first step, on every rank alike:
:func:`refuse_differently_built` (ranks built different modules) and :func:`refuse_meta_attributes`
(tensors held outside the module's parameters and buffers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

_SHOWN = 5


@contextlib.contextmanager
def rank_zero_build(is_global_zero: bool) -> Iterator[None]:
    """Rank 0 creates tensors on the CPU, as an eager build does; every other rank on the meta device."""
    with torch.device("cpu" if is_global_zero else "meta"):
        yield


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _problems_of_every_rank(problems: list[str]) -> list[str]:
    """Every rank's problems, each prefixed with its rank, gathered on every rank (so that all raise together)."""
    if not _distributed():
        return problems
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problems)
    return [f"rank {rank}: {problem}" for rank, each in enumerate(gathered) for problem in each or []]


def _signature(module: nn.Module) -> list[tuple[str, tuple[int, ...], str, str]]:
    """Each parameter and buffer's name, shape, dtype and the first name of the tensor it shares (tied weights)."""
    first_name: dict[int, str] = {}
    entries = []
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        shared = first_name.setdefault(id(tensor), name)
        entries.append((name, tuple(tensor.shape), str(tensor.dtype), shared))
    return entries


def refuse_differently_built(module: nn.Module) -> None:
    """Raise ``ValueError`` on every rank unless every rank built the same parameters and buffers as rank 0.

    Rank 0's values can only be handed to modules of the same structure (names, shapes, dtypes, ties).
    """
    if not _distributed():
        return
    holder = [_signature(module)]
    dist.broadcast_object_list(holder, src=0)
    expected = {entry[0]: entry[1:] for entry in holder[0]}
    own = {entry[0]: entry[1:] for entry in _signature(module)}
    problems = [f"{name}: {own.get(name)} where rank 0 has {expected.get(name)}" for name in _differing(expected, own)]
    problems = _problems_of_every_rank(problems[:_SHOWN])
    if problems:
        raise ValueError(
            "configure_model built different parameters or buffers on different ranks (name: (shape, dtype, "
            "tied to)): " + "; ".join(problems) + ". The module is built on rank 0 and its values handed to the "
            "other ranks, which needs the same module everywhere: make configure_model independent of the rank."
        )


def _differing(expected: Mapping[str, object], own: Mapping[str, object]) -> list[str]:
    names = list(expected) + [name for name in own if name not in expected]
    return [name for name in names if expected.get(name) != own.get(name)]


def meta_attributes(module: nn.Module) -> list[str]:
    """Names of tensors on the meta device that ``module`` holds outside its parameters and buffers."""
    found = []
    for module_name, submodule in module.named_modules():
        for attribute, value in vars(submodule).items():
            if isinstance(value, torch.Tensor) and value.is_meta:
                found.append(f"{module_name}.{attribute}" if module_name else attribute)
    return found


def refuse_meta_attributes(module: nn.Module) -> None:
    """Raise ``ValueError`` on every rank if any rank's module holds meta tensors that are not parameters or buffers.

    A strategy hands over parameters and buffers only: such a tensor would stay without values on the
    ranks that built the module on the meta device, and the run would compute garbage or fail mid-step.
    """
    problems = _problems_of_every_rank(meta_attributes(module)[:_SHOWN])
    if problems:
        raise ValueError(
            "These tensors were created in configure_model but are neither parameters nor buffers, so they "
            "cannot be given rank 0's values on the other ranks (they are on the meta device there): "
            + ", ".join(problems)
            + ". Register each as a buffer (self.register_buffer(name, tensor, persistent=False)), compute it in "
            "forward, or create the module before the run (in __init__) instead of in configure_model."
        )
