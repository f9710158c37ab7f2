"""Optional abilities of a strategy, each a small interface a strategy opts into by subclassing it.

The Trainer asks ``isinstance(strategy, <ability>)`` once, when a run starts, and picks the code
path that fits (see :mod:`stratagem.trainer.accumulation`); a strategy that lacks an ability is
never called for it. All methods here run in every worker, during a run, with the process group
live.
"""

from __future__ import annotations

import contextlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal


class BackwardSyncControl(ABC):
    """A strategy whose backward synchronises gradients across ranks, and that can skip it.

    With ``accumulate_grad_batches > 1`` the Trainer accumulates: it divides each micro-batch's loss
    by the number of micro-batches, runs :meth:`no_backward_sync` around the forward and backward of
    every micro-batch, and steps the optimizers on the last one. Without this ability gradients are
    synchronised on every micro-batch (correct, only slower).
    """

    @abstractmethod
    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """Context for one micro-batch's forward and backward: skips gradient synchronisation when
        ``enabled`` (not the last micro-batch of a window), synchronises as usual otherwise."""


class OwnsAccumulation(ABC):
    """A strategy whose engine accumulates gradients and decides when the optimizer really steps.

    The Trainer then leaves the loss unscaled, and on every micro-batch calls
    :meth:`set_accumulation_boundary`, then ``backward`` and ``optimizer_step`` (the engine steps,
    clips and zeroes only on the boundary); on the boundary it also calls ``clip_gradients`` and
    ``zero_grad`` and counts one optimizer step.
    """

    @abstractmethod
    def set_accumulation_boundary(self, is_boundary: bool) -> None:
        """Told before each training micro-batch's forward: whether the step after it ends an
        accumulation window. Windows are cut short at the end of an epoch, which an engine counting
        micro-batches itself cannot know."""


@dataclass(frozen=True)
class EngineSteps:
    """What one call of an engine that owns the training step did."""

    output: Any
    """What the Trainer treats as ``training_step``'s output: the loss (a scalar tensor) or a dict with a
    ``'loss'`` tensor, reduced over the call's micro-batches; the progress bar and callbacks see it."""
    optimizer_steps: int
    """How many optimizer steps the call made (each one counts towards ``global_step``)."""


class OwnsTrainingStep(ABC):
    """A strategy whose engine runs whole training steps: forward, backward, optimizer step and
    gradient accumulation, over several micro-batches per call (a compiled executable, for instance).

    The Trainer then never calls ``backward``, ``optimizer_step``, ``zero_grad`` or ``clip_gradients``:
    each item of the training data (see :class:`RebuildsDataLoaders`, which such an engine usually
    needs too) goes to :meth:`run_training_steps`, and ``global_step`` advances by the steps it reports.
    ``accumulate_grad_batches`` reaches the engine through ``connect_loop_settings``. Learning-rate
    schedulers step on the host between calls; the strategy hands the changed optimizer to its engine
    before the next call.
    """

    @property
    @abstractmethod
    def optimizer_steps_per_call(self) -> int:
        """How many optimizer steps one full call makes (for the step estimate schedulers read)."""

    @abstractmethod
    def run_training_steps(self, batch: Any, batch_idx: int) -> EngineSteps:
        """Run the engine on one item of the training data (already through ``batch_to_device``)."""


LoaderStage = Literal["fit", "validate", "test", "predict"]


class RebuildsDataLoaders(ABC):
    """A strategy whose engine consumes data in its own form (several micro-batches combined per call,
    a device-side prefetcher): the Trainer hands it every dataloader of a pass, once, before the pass."""

    @abstractmethod
    def rebuild_dataloader(self, loader: Iterable[Any], stage: LoaderStage) -> Iterable[Any]:
        """The loader the pass reads instead of ``loader`` (the user's, already split across ranks where
        the strategy splits data). ``stage`` is ``"fit"`` for the training data, else the pass's stage
        (validation during fit is ``"validate"``). Raise ``ValueError`` naming the setting that cannot work."""


def adopt_legacy_capabilities(cls: type) -> None:
    """Give a strategy class written against stratagem 0.1 the abilities its members declare.

    0.1 declared accumulation by the class attribute ``handles_gradient_accumulation = True`` plus a
    ``set_accumulation_boundary`` override, and gradient-sync control by overriding
    ``no_backward_sync``. Such a class is registered as :class:`OwnsAccumulation` or
    :class:`BackwardSyncControl` with a ``DeprecationWarning`` saying what to subclass instead; a class
    that sets the flag without the method it needs is refused with a ``TypeError``.
    """
    if cls.__dict__.get("handles_gradient_accumulation") is True and not issubclass(cls, OwnsAccumulation):
        if not callable(getattr(cls, "set_accumulation_boundary", None)):
            raise TypeError(
                f"{cls.__qualname__} sets handles_gradient_accumulation = True but defines no "
                "set_accumulation_boundary(is_boundary). The flag is gone: subclass "
                "stratagem.strategies.OwnsAccumulation and implement set_accumulation_boundary, which the "
                "Trainer calls before every micro-batch."
            )
        OwnsAccumulation.register(cls)
        _warn_legacy(cls, "handles_gradient_accumulation = True", "OwnsAccumulation")
    if "no_backward_sync" in cls.__dict__ and not issubclass(cls, BackwardSyncControl):
        BackwardSyncControl.register(cls)
        _warn_legacy(cls, "a no_backward_sync override", "BackwardSyncControl")


def _warn_legacy(cls: type, declared: str, ability: str) -> None:
    warnings.warn(
        f"{cls.__qualname__} declares {declared}, stratagem 0.1's way; it is treated as "
        f"stratagem.strategies.{ability}. Subclass {ability} instead (see docs/writing-a-strategy.md).",
        DeprecationWarning,
        stacklevel=5,
    )
