"""What the loops and the module share during a run, created by the Trainer and handed to them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from stratagem.callbacks.callback import Callback
from stratagem.trainer.callback_hooks import CallbackHooks
from stratagem.trainer.metrics import LoggedMetrics

if TYPE_CHECKING:
    from stratagem.trainer.manual_optimization import ManualSteps


@dataclass
class RunContext:
    """The run state the fit, evaluation and prediction loops and ``Module.log`` read and write.

    The Trainer owns one for its lifetime and passes it to each loop; ``Trainer.callback_metrics``
    and ``Trainer.progress_bar_metrics`` are read from it.
    """

    metrics: LoggedMetrics
    """Everything logged with ``Module.log`` and its aggregation per stage."""
    hooks: CallbackHooks
    """Calls the callbacks' hooks."""
    last_loss: torch.Tensor | None = field(default=None)
    """The last training step's loss as ``training_step`` returned it (its graph already freed by backward),
    shown as ``loss`` on the progress bar; only ever read as a float."""
    manual: ManualSteps | None = field(default=None)
    """During a fit of a module with ``automatic_optimization = False``: what ``manual_backward`` and its
    optimizers call; ``None`` otherwise."""

    @classmethod
    def for_callbacks(cls, callbacks: Sequence[Callback], metrics: LoggedMetrics | None = None) -> RunContext:
        """A context dispatching hooks to ``callbacks``, with ``metrics`` kept (or new ones)."""
        return cls(metrics=metrics if metrics is not None else LoggedMetrics(), hooks=CallbackHooks(callbacks))
