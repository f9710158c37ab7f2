"""Who accumulates gradients over micro-batches: the Trainer, or the strategy's engine.

Chosen once per fit by :func:`accumulation_policy`, from the strategy's abilities
(:mod:`stratagem.strategies.capabilities`); the fit loop then calls the policy on every micro-batch
without asking the strategy what it can do.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim import Optimizer

from stratagem.strategies import BackwardSyncControl, OwnsAccumulation, Strategy


class AccumulationPolicy(ABC):
    """What the fit loop does around one training micro-batch besides forward and backward."""

    @abstractmethod
    def micro_batch(self, is_boundary: bool) -> contextlib.AbstractContextManager[Any]:
        """Context around the micro-batch's forward and backward; ``is_boundary`` when the optimizers step after it."""

    @abstractmethod
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to run backward on."""

    @abstractmethod
    def between_steps(self) -> None:
        """After the backward of a micro-batch that is not the last of its window."""


class TrainerAccumulation(AccumulationPolicy):
    """The Trainer sums gradients: each loss divided by the window's length, gradient sync skipped
    until the last micro-batch where the strategy can skip it, the optimizers stepped on the boundary."""

    def __init__(self, accumulate: int, skip_sync: Callable[[bool], contextlib.AbstractContextManager[Any]]) -> None:
        self.accumulate = accumulate
        self._skip_sync = skip_sync

    def micro_batch(self, is_boundary: bool) -> contextlib.AbstractContextManager[Any]:
        return self._skip_sync(not is_boundary)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss / self.accumulate if self.accumulate > 1 else loss

    def between_steps(self) -> None:
        pass


class EngineAccumulation(AccumulationPolicy):
    """The strategy's engine sums gradients and steps itself: told every boundary, stepped every micro-batch."""

    def __init__(
        self, strategy: Strategy, set_boundary: Callable[[bool], None], optimizers: Sequence[Optimizer]
    ) -> None:
        self.strategy = strategy
        self._set_boundary = set_boundary
        self.optimizers = list(optimizers)

    def micro_batch(self, is_boundary: bool) -> contextlib.AbstractContextManager[Any]:
        self._set_boundary(is_boundary)
        return contextlib.nullcontext()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def between_steps(self) -> None:
        for optimizer in self.optimizers:
            self.strategy.optimizer_step(optimizer)


def accumulation_policy(strategy: Strategy, accumulate: int, optimizers: Sequence[Optimizer]) -> AccumulationPolicy:
    """The one place a strategy's accumulation abilities are looked at."""
    if isinstance(strategy, OwnsAccumulation):
        return EngineAccumulation(strategy, strategy.set_accumulation_boundary, optimizers)
    if accumulate > 1 and isinstance(strategy, BackwardSyncControl):
        return TrainerAccumulation(accumulate, strategy.no_backward_sync)
    return TrainerAccumulation(accumulate, _always_synced)


def _always_synced(enabled: bool) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()
