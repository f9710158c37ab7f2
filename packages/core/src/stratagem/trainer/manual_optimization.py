"""Manual optimization (``automatic_optimization = False``): ``training_step`` runs its own backwards and
steps its own optimizers, as in Lightning.

The fit loop then only calls ``training_step``. ``Module.manual_backward`` and the optimizers
``Module.optimizers()`` hands out reach the strategy through :class:`ManualSteps`, built once per fit from
the calls the run's :class:`~stratagem.Runtime` hands out.
Every optimizer step counts towards ``global_step`` (two optimizers stepped per batch advance it by two,
as in Lightning), and the Trainer steps no learning-rate scheduler: ``training_step`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from stratagem.strategies import OwnsAccumulation, OwnsTrainingStep, RefusesManualOptimization, Strategy

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.strategies.capabilities import StepBoundary
    from stratagem.trainer.settings import TrainerSettings
    from stratagem.trainer.step_hooks import StepHooks


def manual_optimization_problem(strategy: Strategy) -> str | None:
    """Why ``strategy`` cannot run a module that optimizes manually, or ``None`` when it can."""
    if isinstance(strategy, RefusesManualOptimization):
        return strategy.manual_optimization_unsupported
    if isinstance(strategy, OwnsTrainingStep):
        return "its engine runs whole training steps itself (an OwnsTrainingStep strategy)"
    if isinstance(strategy, OwnsAccumulation):
        return (
            "its engine runs backward and the optimizer step itself (an OwnsAccumulation strategy), so there is no "
            "backward or step for training_step to call"
        )
    return None


def check_manual_optimization(module: Module, strategy: Strategy, settings: TrainerSettings) -> None:
    """Refuse, before any process starts, a manually optimizing module that the strategy or the Trainer's
    settings cannot run."""
    automatic = module.automatic_optimization
    if not isinstance(automatic, bool):
        raise TypeError(
            f"{type(module).__name__}.automatic_optimization={automatic!r} is not valid; expected True or False."
        )
    if automatic:
        return
    subject = f"{type(module).__name__} sets automatic_optimization = False"
    problem = manual_optimization_problem(strategy)
    if problem is not None:
        raise ValueError(
            f"{subject}, which {type(strategy).__name__} cannot run: {problem}. Return the loss from training_step "
            "with automatic optimization, or use a strategy whose backward and optimizer step the Trainer calls "
            "(single_device, ddp, fsdp, ...)."
        )
    if settings.accumulate_grad_batches != 1:
        raise ValueError(
            f"{subject}, but accumulate_grad_batches={settings.accumulate_grad_batches}: the Trainer accumulates only "
            "for automatic optimization. Use accumulate_grad_batches=1 and step the optimizers every N batches in "
            "training_step."
        )
    if settings.gradient_clip_val is not None:
        raise ValueError(
            f"{subject}, but gradient_clip_val={settings.gradient_clip_val}: the Trainer clips only in its own "
            "optimizer step. Use gradient_clip_val=None and call self.clip_gradients(optimizer, gradient_clip_val=...) "
            "in training_step before optimizer.step()."
        )
    if settings.nonfinite == "skip":
        raise ValueError(
            f"{subject}, but nonfinite='skip' skips the Trainer's optimizer step, which training_step takes here. "
            "Use nonfinite='error' (a non-finite loss given to manual_backward stops the run) or 'ignore'."
        )


class ManualSteps:
    """What ``Module.manual_backward`` and the handed-out optimizers do during one fit."""

    def __init__(
        self,
        prepare_backward: Callable[[torch.Tensor], None] | None,
        optimizers: Sequence[Optimizer],
        backward: Callable[[torch.Tensor], Any],
        optimizer_step: Callable[[Optimizer], Any],
        hooks: StepHooks,
        loss_is_usable: Callable[[torch.Tensor | None, int], bool] | None,
        at_step_boundary: Callable[[StepBoundary], None] | None,
        count_step: Callable[[], None],
    ) -> None:
        self._prepare = prepare_backward
        self._backward = backward
        self._optimizer_step = optimizer_step
        self._hooks = hooks
        self._loss_is_usable = loss_is_usable
        self._at_step_boundary = at_step_boundary
        self._count_step = count_step
        self.optimizers = [ManualOptimizer(optimizer, self) for optimizer in optimizers]
        self.batch_idx = 0
        """The batch ``training_step`` runs on (named when a loss is not finite)."""

    def backward(self, loss: torch.Tensor) -> None:
        if self._loss_is_usable is not None:
            # Raises for a non-finite loss (nonfinite="error"); "skip" is refused before the run.
            self._loss_is_usable(loss, self.batch_idx)
        if self._prepare is not None:
            self._prepare(loss)
        self._hooks.call_before_backward(loss)
        self._backward(loss)
        self._hooks.call_after_backward()
        if self._at_step_boundary is not None:
            self._at_step_boundary("after_backward")

    def step(self, optimizer: Optimizer, closure: Callable[[], Any] | None) -> Any:
        if closure is not None:
            closure()
        self._hooks.call_before_optimizer_step(optimizer)
        result = self._optimizer_step(optimizer)
        if self._at_step_boundary is not None:
            self._at_step_boundary("after_optimizer_step")
        self._count_step()
        return result


class ManualOptimizer:
    """An optimizer as ``Module.optimizers()`` hands it out under manual optimization (Lightning's
    ``LightningOptimizer``): :meth:`step` goes through the strategy (the precision's loss scaler included),
    runs ``on_before_optimizer_step`` and counts one ``global_step``; everything else is the optimizer's own."""

    def __init__(self, optimizer: Optimizer, steps: ManualSteps) -> None:
        self._optimizer = optimizer
        self._steps = steps

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped optimizer (what ``trainer.optimizers`` holds)."""
        return self._optimizer

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step the optimizer on its parameters' gradients; ``closure``, when given, is called once before."""
        return self._steps.step(self._optimizer, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients of the optimizer's parameters."""
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        if name in ("_optimizer", "_steps"):  # not set yet (while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"ManualOptimizer({self._optimizer!r})"
