"""Who runs a training step and accumulates gradients: the Trainer, or the strategy's engine.

Chosen once per fit by :func:`accumulation_policy`, from the strategy's abilities as the run's
:class:`~stratagem.Runtime` hands them out (:mod:`stratagem.strategies.capabilities`); the fit loop then hands
every item of the training data to the policy without asking what the strategy can do.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.optim import Optimizer

from stratagem.strategies import EngineSteps

if TYPE_CHECKING:
    from stratagem.runtime import Runtime


class TrainingLoopSteps(Protocol):
    """What the fit loop offers a policy to build one item of training data out of."""

    def forward_backward(
        self, batch: Any, batch_idx: int, scale_loss: Callable[[torch.Tensor], torch.Tensor] | None
    ) -> tuple[Any, bool]:
        """``training_step`` and backward on its loss (scaled by ``scale_loss`` unless ``None``); whether
        backward ran (not when the step gave no loss, or one the Trainer's ``nonfinite`` check skips)."""

    def step_optimizers(self) -> None:
        """Clip, step and zero the optimizers if the window has gradients, and count the step; a non-finite
        gradient norm from clipping stops the run, or (``nonfinite="skip"``) drops the gradients uncounted."""

    def record_engine_steps(self, output: Any, optimizer_steps: int) -> None:
        """Take an engine call's reduced output and count the optimizer steps it made."""

    def manual_training_step(self, batch: Any, batch_idx: int) -> Any:
        """``training_step`` of a module that runs its own backwards and optimizer steps; its output."""


class AccumulationPolicy(ABC):
    """What the fit loop does with one item of the training data."""

    @abstractmethod
    def run_batch(self, batch: Any, batch_idx: int, is_boundary: bool, loop: TrainingLoopSteps) -> Any:
        """Train on ``batch`` (``is_boundary`` when the Trainer's accumulation window ends with it); return
        what callbacks receive as the step's output."""

    @abstractmethod
    def optimizer_steps(self, num_batches: int) -> int:
        """How many optimizer steps an epoch of ``num_batches`` items makes."""


class MicroBatchAccumulation(AccumulationPolicy):
    """The Trainer runs forward and backward per micro-batch and steps on the window's last one."""

    def __init__(self, accumulate: int) -> None:
        self.accumulate = accumulate

    @abstractmethod
    def micro_batch(self, is_boundary: bool) -> contextlib.AbstractContextManager[Any]:
        """Context around the micro-batch's forward and backward; ``is_boundary`` when the optimizers step after it."""

    @abstractmethod
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to run backward on."""

    @abstractmethod
    def between_steps(self) -> None:
        """After the backward of a micro-batch that is not the last of its window."""

    def run_batch(self, batch: Any, batch_idx: int, is_boundary: bool, loop: TrainingLoopSteps) -> Any:
        with self.micro_batch(is_boundary):
            output, ran_backward = loop.forward_backward(batch, batch_idx, self.scale_loss)
        if is_boundary:
            loop.step_optimizers()
        elif ran_backward:
            self.between_steps()
        return output

    def optimizer_steps(self, num_batches: int) -> int:
        return math.ceil(num_batches / self.accumulate)


class TrainerAccumulation(MicroBatchAccumulation):
    """The Trainer sums gradients: each loss divided by the window's length, gradient sync skipped
    until the last micro-batch where the strategy can skip it, the optimizers stepped on the boundary."""

    def __init__(self, accumulate: int, skip_sync: Callable[[bool], contextlib.AbstractContextManager[Any]]) -> None:
        super().__init__(accumulate)
        self._skip_sync = skip_sync

    def micro_batch(self, is_boundary: bool) -> contextlib.AbstractContextManager[Any]:
        return self._skip_sync(not is_boundary)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss / self.accumulate if self.accumulate > 1 else loss

    def between_steps(self) -> None:
        pass


class StepEveryBatch(TrainerAccumulation):
    """No accumulation: every batch ends with an optimizer step, there is no loss to scale and no sync to
    skip, so the per-batch path enters no context and makes no call that would do nothing."""

    def __init__(self) -> None:
        super().__init__(1, _always_synced)

    def run_batch(self, batch: Any, batch_idx: int, is_boundary: bool, loop: TrainingLoopSteps) -> Any:
        output, _ = loop.forward_backward(batch, batch_idx, None)
        loop.step_optimizers()
        return output


class EngineAccumulation(MicroBatchAccumulation):
    """The strategy's engine sums gradients and steps itself: told every boundary, stepped every micro-batch."""

    def __init__(
        self,
        optimizer_step: Callable[[Optimizer], Any],
        set_boundary: Callable[[bool], None],
        optimizers: Sequence[Optimizer],
        accumulate: int = 1,
    ) -> None:
        super().__init__(accumulate)
        self._optimizer_step = optimizer_step
        self._set_boundary = set_boundary
        self.optimizers = list(optimizers)

    def micro_batch(self, is_boundary: bool) -> contextlib.AbstractContextManager[Any]:
        self._set_boundary(is_boundary)
        return contextlib.nullcontext()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def between_steps(self) -> None:
        for optimizer in self.optimizers:
            self._optimizer_step(optimizer)


class EngineTrainingSteps(AccumulationPolicy):
    """The strategy's engine runs whole steps (forward, backward, optimizer step, accumulation) per call;
    the Trainer only counts the steps it reports."""

    def __init__(self, run_training_steps: Callable[[Any, int], EngineSteps], steps_per_call: int) -> None:
        self._run_training_steps = run_training_steps
        self.steps_per_call = steps_per_call

    def run_batch(self, batch: Any, batch_idx: int, is_boundary: bool, loop: TrainingLoopSteps) -> Any:
        steps = self._run_training_steps(batch, batch_idx)
        loop.record_engine_steps(steps.output, steps.optimizer_steps)
        return steps.output

    def optimizer_steps(self, num_batches: int) -> int:
        return num_batches * self.steps_per_call


class ManualOptimization(AccumulationPolicy):
    """``training_step`` runs its own backwards and optimizer steps (``automatic_optimization = False``); the
    Trainer accumulates nothing (``accumulate_grad_batches`` is refused before the run)."""

    def run_batch(self, batch: Any, batch_idx: int, is_boundary: bool, loop: TrainingLoopSteps) -> Any:
        return loop.manual_training_step(batch, batch_idx)

    def optimizer_steps(self, num_batches: int) -> int:
        # What training_step steps is its own choice: one per batch is the estimate Lightning gives too.
        return num_batches


def accumulation_policy(
    runtime: Runtime,
    accumulate: int,
    optimizers: Sequence[Optimizer],
    optimizer_step: Callable[[Optimizer], Any],
    automatic_optimization: bool = True,
) -> AccumulationPolicy:
    """The one place the Trainer picks who runs a training step, from the training-step abilities ``runtime``
    hands out (for manual optimization, which strategies can run it is
    :func:`stratagem.trainer.manual_optimization.manual_optimization_problem`). ``optimizer_step`` is the loop's
    (``StepCalls.optimizer_step``), which an engine that accumulates is stepped with between boundaries."""
    if not automatic_optimization:
        return ManualOptimization()
    engine = runtime.engine_training_steps
    if engine is not None:
        return EngineTrainingSteps(*engine)
    set_boundary = runtime.accumulation_boundary
    if set_boundary is not None:
        return EngineAccumulation(optimizer_step, set_boundary, optimizers, accumulate)
    if accumulate == 1:
        return StepEveryBatch()
    return TrainerAccumulation(accumulate, runtime.gradient_sync_skipper or _always_synced)


def _always_synced(enabled: bool) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()
