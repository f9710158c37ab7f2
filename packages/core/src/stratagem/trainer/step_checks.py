"""What the fit loop checks about every training step before it changes the weights.

Two faults are caught where they happen instead of turning into a hang or NaN weights later:

- ranks that disagree on whether a batch gave a loss (``training_step`` returned ``None`` on some ranks
  only): the others would wait forever in backward's gradient synchronisation;
- a loss, or a gradient norm that clipping computed, that is NaN or infinite: the optimizer step would
  write it into the weights, and every checkpoint after it.

What each rank's loss was rides on one exchange per step (``Runtime.gather_step_outcome``, no
collective on one process), so that every rank takes the same decision: raise naming the step, or skip the
batch everywhere. The gradient norm needs none: clipping computes the whole gradient's, the same on every rank.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from stratagem.runtime import Runtime
    from stratagem.trainer.progress import FitProgress
    from stratagem.trainer.settings import NonFinite

NO_LOSS, FINITE, NOT_FINITE = 0, 1, 2
"""A rank's outcome of one training step, as :meth:`Strategy.gather_step_outcome` exchanges it."""

_OPTION_HINT = (
    "Trainer(nonfinite='skip') skips such steps on every rank and trains on; nonfinite='ignore' checks nothing."
)


class StepChecks:
    """Decides, on every rank alike, whether a training step may go on to backward and the optimizer step."""

    def __init__(self, runtime: Runtime, nonfinite: NonFinite, progress: FitProgress, manual: bool = False) -> None:
        self.nonfinite = nonfinite
        # Under manual optimization the loss reaches the check from manual_backward, and only "ignore" is another
        # choice ("skip" is refused before such a run).
        self._subject = "manual_backward got" if manual else "training_step returned"
        self._hint = "Trainer(nonfinite='ignore') checks nothing." if manual else _OPTION_HINT
        self.progress = progress
        self.rank = runtime.global_rank
        # Decided once: one process has nobody to agree with, and with nonfinite="ignore" nothing is read.
        self._alone = runtime.world_size == 1
        self._gather = runtime.gather_step_outcome
        reads = runtime.reads_steps_on_host
        self._reads_loss = nonfinite != "ignore" and reads
        self.needed = reads and (not self._alone or self._reads_loss)
        """False when :attr:`loss_is_usable` would only say whether there is a loss: the loop then does not call it."""
        self.loss_is_usable: Callable[[torch.Tensor | None, int], bool] = (
            self._loss_is_usable_alone if self._alone else self._loss_is_usable_on_every_rank
        )
        """Whether backward may run on ``loss`` (``None``: the batch gave none), the same answer on every rank;
        called with the loss and the batch index. Raises when ranks disagree on having a loss, or
        (``nonfinite="error"``) when any rank's loss is not finite."""

    def _loss_is_usable_alone(self, loss: torch.Tensor | None, batch_idx: int) -> bool:
        # The per-step path of every single-process run: no list, no exchange.
        if loss is None or not self._reads_loss or _finite(loss):
            return loss is not None
        return self._non_finite([NOT_FINITE], loss, batch_idx)

    def _loss_is_usable_on_every_rank(self, loss: torch.Tensor | None, batch_idx: int) -> bool:
        outcome = NO_LOSS if loss is None else FINITE
        if loss is not None and self._reads_loss and not _finite(loss):
            outcome = NOT_FINITE
        outcomes = self._gather(outcome)
        if outcomes.count(outcome) != len(outcomes) and NO_LOSS in outcomes:
            raise RuntimeError(self._disagreement(outcomes, batch_idx))
        if NOT_FINITE not in outcomes:
            return outcome != NO_LOSS
        return self._non_finite(outcomes, loss if outcome == NOT_FINITE else None, batch_idx)

    def _non_finite(self, outcomes: list[int], loss: torch.Tensor | None, batch_idx: int) -> bool:
        """Raise, or warn and return False (skip), for a step whose loss is not finite on some ranks (``loss``:
        this rank's, when it is one of them)."""
        ranks = _ranks(outcomes, NOT_FINITE)
        value = "" if loss is None else f" ({float(loss.detach().float().sum())})"
        where = "" if self._alone else f" on {ranks}"
        if self.nonfinite == "error":
            raise RuntimeError(
                f"{self._subject} a non-finite loss{value}{where}{self._at(batch_idx)}. The run stops "
                "before its backward and optimizer step, so the weights (and the last checkpoint) are those after "
                f"step {self.progress.global_step}. {self._hint}"
            )
        warnings.warn(
            f"Skipped the batch: training_step returned a non-finite loss{value}{where}{self._at(batch_idx)} "
            "(Trainer(nonfinite='skip')).",
            RuntimeWarning,
            stacklevel=2,
        )
        return False

    def gradient_norm_is_usable(self, norm: torch.Tensor | None, batch_idx: int) -> bool:
        """Whether the optimizers may step with gradients of total ``norm`` (as ``clip_gradients`` returned it:
        the norm of the whole gradient, the same on every rank; ``None`` when it computed none)."""
        if norm is None or not self._reads_loss or math.isfinite(float(norm)):
            return True
        if self.nonfinite == "error":
            raise RuntimeError(
                f"The gradient norm is {float(norm)}{self._at(batch_idx)}. The run stops before the optimizer step, "
                f"so the weights (and the last checkpoint) are those after step {self.progress.global_step}. "
                f"{self._hint}"
            )
        warnings.warn(
            f"Skipped the optimizer step: the gradient norm is {float(norm)}{self._at(batch_idx)} "
            "(Trainer(nonfinite='skip')).",
            RuntimeWarning,
            stacklevel=2,
        )
        return False

    def _at(self, batch_idx: int) -> str:
        progress = self.progress
        return f" at batch_idx {batch_idx} of epoch {progress.epoch} (global_step {progress.global_step})"

    def _disagreement(self, outcomes: list[int], batch_idx: int) -> str:
        without = _ranks(outcomes, NO_LOSS)
        with_loss = _ranks([NO_LOSS if outcome == NO_LOSS else FINITE for outcome in outcomes], FINITE)
        return (
            f"The ranks disagree{self._at(batch_idx)}: training_step returned None on {without} and a loss on "
            f"{with_loss} (this is rank {self.rank}). Backward synchronises gradients across ranks, so a rank "
            "without a loss would leave the others waiting: return a loss on every rank or None on every rank for "
            "the same batch (to skip a batch on a condition, decide it from data every rank sees alike, or reduce "
            "it with self.trainer.strategy.reduce_boolean)."
        )


def _finite(loss: torch.Tensor) -> bool:
    try:
        # One read of a scalar is the cheapest check there is (a few hundred ns on the CPU; on an accelerator it
        # waits for the step's forward, which backward does not need to).
        return math.isfinite(loss.item())
    except RuntimeError:
        return bool(torch.isfinite(loss.detach()).all())


def _ranks(outcomes: list[int], wanted: int) -> str:
    ranks = [str(rank) for rank, outcome in enumerate(outcomes) if outcome == wanted]
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}"
