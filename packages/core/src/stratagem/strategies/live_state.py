"""What a strategy turns into state itself when it saves: a module, an optimizer, or a run's list of optimizers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

from torch import nn
from torch.optim import Optimizer


def is_optimizer_list(value: Any) -> TypeGuard[Sequence[Optimizer]]:
    """Whether ``value`` is a non-empty list or tuple of optimizers, as a checkpoint's ``"optimizers"`` entry holds
    a run's optimizers."""
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(item, Optimizer) for item in value)


def is_live_state(value: Any) -> bool:
    """Whether ``value`` is a module, an optimizer or a list of optimizers: a live object whose state the strategy
    saves and loads, rather than a value the checkpoint holds as it is."""
    return isinstance(value, nn.Module | Optimizer) or is_optimizer_list(value)
