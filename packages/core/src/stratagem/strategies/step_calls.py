"""The strategy methods a training loop calls on every batch, resolved once per fit.

Where a strategy and its precision keep the base class's implementation of a per-step method, what
that method does is known before the first batch: fp32 needs no autocast context, an unwrapped
module is called directly, backward and the optimizer step are the plain tensor and optimizer
calls. The loop then calls that directly instead of going through two or three wrappers that
change nothing, which on small models costs more than the rest of the Trainer's own work per
step. A method overridden by a strategy's or precision's class, or set on the instance, is always
called as it is.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.optim import Optimizer

from stratagem.precision import Precision
from stratagem.strategies._batch import device_mover
from stratagem.strategies._forward_redirect import step_caller
from stratagem.strategies.strategy import Strategy


@dataclass(frozen=True)
class StepCalls:
    """What the loop calls per batch; each does what the strategy method it stands for does."""

    batch_to_device: Callable[[Any], Any]
    """:meth:`Strategy.batch_to_device`."""
    run_step: Callable[..., Any]
    """:meth:`Strategy.run_step` with the step's name bound: called with the step's arguments."""
    backward: Callable[[torch.Tensor], Any]
    """:meth:`Strategy.backward` with the optimizer bound: called with the loss."""
    optimizer_step: Callable[[Optimizer], Any]
    """:meth:`Strategy.optimizer_step`."""
    zero_grad: Callable[[Optimizer], None]
    """:meth:`Strategy.zero_grad`."""
    clip_gradients: Callable[[Optimizer, float, Literal["norm", "value"]], torch.Tensor | None]
    """:meth:`Strategy.clip_gradients`."""


def step_calls(strategy: Strategy, step_name: str, backward_optimizer: Optimizer | None) -> StepCalls:
    """The per-step calls of ``strategy``, once its module is set up (``strategy.model`` is final)."""
    precision = strategy.precision
    return StepCalls(
        batch_to_device=_batch_to_device(strategy, precision),
        run_step=_run_step(strategy, precision, step_name),
        backward=_backward(strategy, precision, backward_optimizer),
        optimizer_step=_optimizer_step(strategy, precision),
        zero_grad=_zero_grad(strategy),
        clip_gradients=strategy.clip_gradients,
    )


def batch_to_device_call(strategy: Strategy) -> Callable[[Any], Any]:
    """:meth:`Strategy.batch_to_device` in its direct form where the strategy and precision keep the base one;
    needs no set-up module (a loader may be prepared before it)."""
    return _batch_to_device(strategy, strategy.precision)


def _batch_to_device(strategy: Strategy, precision: Precision) -> Callable[[Any], Any]:
    if _inherited(strategy, "batch_to_device", Strategy.batch_to_device) and _inherited(
        precision, "convert_input", Precision.convert_input
    ):
        return device_mover(strategy.root_device)
    return strategy.batch_to_device


def _run_step(strategy: Strategy, precision: Precision, step_name: str) -> Callable[..., Any]:
    if _inherited(strategy, "run_step", Strategy.run_step) and _inherited(
        precision, "forward_context", Precision.forward_context
    ):
        return step_caller(strategy.model, strategy.module, step_name)
    return functools.partial(strategy.run_step, step_name)


def _backward(strategy: Strategy, precision: Precision, optimizer: Optimizer | None) -> Callable[[torch.Tensor], Any]:
    if _inherited(strategy, "backward", Strategy.backward) and _inherited(precision, "backward", Precision.backward):
        if _inherited(strategy, "explain_backward_failure", Strategy.explain_backward_failure):
            return torch.Tensor.backward
        explain = strategy.explain_backward_failure

        # One frame rather than the base method's chain of strategy, precision and tensor calls, which cost the tiny
        # MLP under ddp about 1% of its step (tools/bench/own_loop; a single frame measured at parity).
        def explained_backward(loss: torch.Tensor) -> None:
            try:
                torch.Tensor.backward(loss)
            except RuntimeError as error:
                explain(error)
                raise

        return explained_backward
    backward = strategy.backward

    def backward_with_optimizer(loss: torch.Tensor) -> None:
        backward(loss, optimizer)

    return backward_with_optimizer


def _optimizer_step(strategy: Strategy, precision: Precision) -> Callable[[Optimizer], Any]:
    if _inherited(strategy, "optimizer_step", Strategy.optimizer_step) and _inherited(
        precision, "optimizer_step", Precision.optimizer_step
    ):
        return _STEP
    return strategy.optimizer_step


def _zero_grad(strategy: Strategy) -> Callable[[Optimizer], None]:
    if _inherited(strategy, "zero_grad", Strategy.zero_grad):
        return PLAIN_ZERO_GRAD
    return strategy.zero_grad


# Called the way the base methods call them, with the method looked up on the optimizer per call (a scheduler
# or callback may wrap ``step``), without a Python frame of their own.
_STEP: Callable[[Optimizer], Any] = operator.methodcaller("step")
PLAIN_ZERO_GRAD: Callable[[Optimizer], None] = operator.methodcaller("zero_grad", set_to_none=True)
"""What :attr:`StepCalls.zero_grad` is where the strategy keeps the base ``zero_grad``: the optimizer's own."""


def _inherited(owner: object, name: str, base_function: Callable[..., Any]) -> bool:
    """Whether ``owner.<name>`` is ``base_function``: neither its class nor the instance replaced it."""
    return getattr(getattr(owner, name), "__func__", None) is base_function
