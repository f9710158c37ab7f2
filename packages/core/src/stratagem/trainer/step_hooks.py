"""The hooks around backward and the optimizer step, bound once per fit.

Each hook runs the callbacks' version first and then the module's, as Lightning calls them; only the
overridden ones are kept, so a hook nobody defines costs nothing per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from stratagem.module import Module

if TYPE_CHECKING:
    from stratagem.trainer.callback_hooks import CallbackHooks
    from stratagem.trainer.trainer import Trainer


class StepHooks:
    """``on_before_backward``, ``on_after_backward`` and ``on_before_optimizer_step`` of a run's callbacks and
    module."""

    def __init__(self, hooks: CallbackHooks, trainer: Trainer, module: Module) -> None:
        self.before_backward: list[Callable[[torch.Tensor], Any]] = _bound(hooks, trainer, module, "on_before_backward")
        self.after_backward: list[Callable[[], Any]] = _bound(hooks, trainer, module, "on_after_backward")
        self.before_optimizer_step: list[Callable[[Optimizer], Any]] = _bound(
            hooks, trainer, module, "on_before_optimizer_step"
        )

    def call_before_backward(self, loss: torch.Tensor) -> None:
        for hook in self.before_backward:
            hook(loss)

    def call_after_backward(self) -> None:
        for hook in self.after_backward:
            hook()

    def call_before_optimizer_step(self, optimizer: Optimizer) -> None:
        for hook in self.before_optimizer_step:
            hook(optimizer)


def _bound(hooks: CallbackHooks, trainer: Trainer, module: Module, name: str) -> list[Callable[..., Any]]:
    found: list[Callable[..., Any]] = [functools.partial(hook, trainer, module) for hook in hooks.overriding(name)]
    if getattr(type(module), name) is not getattr(Module, name):
        found.append(getattr(module, name))
    return found
