"""Turning the user's module into FSDP units: activation checkpointing, then ``fully_shard`` per policy and root."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed._composable.contract import _get_registry
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp.wrap import enable_wrap

from stratagem_fsdp.options import ModuleSelector


class ShardedRoot(nn.Module):
    """The outermost FSDP unit: holds the user's module and calls it.

    FSDP gathers a unit's parameters in hooks around that unit's ``__call__``. The Trainer
    calls a step method (``training_step``) through the root's forward, so all root-level
    parameters are gathered for the whole step, whichever submodules the step uses. Sharding
    the user's module itself would instead run those hooks again when the step calls
    ``self(x)``.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


_ROOT_ATTRIBUTE = "_stratagem_fsdp_root"


def sharded_root_of(module: nn.Module) -> ShardedRoot | None:
    """The root that :func:`shard_module` made for ``module``, if it did."""
    root = module.__dict__.get(_ROOT_ATTRIBUTE)
    return root if isinstance(root, ShardedRoot) else None


_MANUAL_UNIT_ATTRIBUTE = "_stratagem_fsdp_manual_unit"


def _mark_as_unit(module: nn.Module, **_: Any) -> nn.Module:
    module.__dict__[_MANUAL_UNIT_ATTRIBUTE] = True
    return module


def _marked_as_unit(module: nn.Module) -> bool:
    return bool(module.__dict__.get(_MANUAL_UNIT_ATTRIBUTE, False))


@contextlib.contextmanager
def manual_wrapping() -> Iterator[None]:
    """Make torch's ``wrap(submodule)`` (``torch.distributed.fsdp.wrap``), called in ``configure_model``, mark
    that submodule as its own FSDP unit, as Lightning's FSDP strategy does; ``setup_module`` shards it.

    Outside ``enable_wrap`` torch's ``wrap`` returns the module untouched, which would lose the
    per-layer sharding the user asked for without a word.
    """
    with enable_wrap(wrapper_cls=_mark_as_unit):
        yield


def has_activation_checkpointing(module: nn.Module) -> bool:
    """Whether any submodule is already checkpointed (by ``checkpoint_wrapper`` or composable ``checkpoint``)."""
    return any(
        isinstance(sub, CheckpointWrapper) or "checkpoint" in (_get_registry(sub) or {}) for sub in module.modules()
    )


def apply_activation_checkpointing(module: nn.Module, selector: ModuleSelector) -> None:
    """Recompute the activations of the outermost selected submodules in backward instead of keeping them.

    Uses the composable ``checkpoint``, which adds hooks and keeps parameter names unchanged
    (so checkpoints stay portable). Nothing is applied where checkpointing already is.
    """
    if has_activation_checkpointing(module):
        warnings.warn(
            "activation_checkpointing_policy is set, but the module already has checkpointed submodules; "
            "leaving them as they are and applying nothing more.",
            stacklevel=3,
        )
        return
    for submodule in _outermost(module, lambda sub: selector(sub, _numel(sub))):
        checkpoint(submodule)


def data_parallel_submesh(mesh: DeviceMesh) -> DeviceMesh:
    """The submesh of a layout's whole mesh (:mod:`stratagem.mesh`) that ``fully_shard`` shards over: ``"dp_shard"``,
    or ``("dp_replicate", "dp_shard")`` when there are replicas (HSDP: shards within a group, gradients all-reduced
    between groups)."""
    return mesh["dp_replicate", "dp_shard"] if mesh["dp_replicate"].size() > 1 else mesh["dp_shard"]


def shard_module(
    module: nn.Module,
    selector: ModuleSelector | None,
    mesh: Any,
    unit_kwargs: dict[str, Any],
    root_kwargs: dict[str, Any],
    children_are_units: bool = False,
) -> ShardedRoot:
    """Apply ``fully_shard`` to the submodules ``selector`` picks (children before parents), then to a root.

    Submodules the user already sharded, and everything inside them, are left as they are.
    ``children_are_units``: also every child of ``module`` holding parameters outside the picked units.
    """
    for submodule in selected_units(module, selector, children_are_units):
        fully_shard(submodule, mesh=mesh, **unit_kwargs)
    root = ShardedRoot(module)
    fully_shard(root, mesh=mesh, **root_kwargs)
    # Kept outside nn.Module's registry: the root must not become a submodule of its own child.
    object.__setattr__(module, _ROOT_ATTRIBUTE, root)
    return root


def refuse_root_parameters_under_manual_optimization(module: nn.Module) -> None:
    """Refuse parameters set on ``module`` itself: FSDP gathers them for the whole ``training_step`` and reduces
    their gradients only after it, so an optimizer stepped in ``training_step`` would step unreduced ones."""
    names = [name for name, _ in module.named_parameters(recurse=False)]
    if names:
        raise ValueError(
            f"{type(module).__name__} sets automatic_optimization = False and holds parameters of its own "
            f"({', '.join(names)}), which fsdp cannot reduce between the backwards training_step runs. Move them into "
            "a submodule (e.g. an nn.Module holding them), which fsdp then shards as a unit of its own."
        )


def selected_units(
    module: nn.Module, selector: ModuleSelector | None, children_are_units: bool = False
) -> list[nn.Module]:
    """The submodules ``selector`` makes FSDP units, and those given to ``wrap()`` in ``configure_model``,
    children before parents; user-sharded subtrees excluded. ``children_are_units``: also each child of
    ``module`` that holds parameters outside those."""
    selected: list[nn.Module] = []
    # A submodule registered under two names (``self.model = nn.Sequential(self.layer, ...)``) is one unit.
    visited: set[int] = set()

    def visit(current: nn.Module) -> int:
        """Add selected descendants of ``current``; return its parameter count not yet in a selected unit."""
        remaining = sum(parameter.numel() for parameter in current.parameters(recurse=False))
        for child in current.children():
            if isinstance(child, FSDPModule) or id(child) in visited:
                continue
            visited.add(id(child))
            child_remaining = visit(child)
            whole_child = children_are_units and current is module and child_remaining > 0
            if whole_child or _marked_as_unit(child) or (selector is not None and selector(child, child_remaining)):
                selected.append(child)
            else:
                remaining += child_remaining
        return remaining

    if not isinstance(module, FSDPModule):
        visit(module)
    return selected


def _outermost(module: nn.Module, predicate: Any) -> Iterator[nn.Module]:
    for child in module.children():
        if predicate(child):
            yield child
        else:
            yield from _outermost(child, predicate)


def _numel(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())
