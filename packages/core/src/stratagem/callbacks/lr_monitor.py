"""LearningRateMonitor: every optimizer param group's learning rate, sent to the loggers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from stratagem.callbacks.callback import Callback, RunStage

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer


class LearningRateMonitor(Callback):
    """Log the learning rate of each optimizer's param groups, under the names Lightning gives them.

    ``logging_interval="step"`` logs the rate each optimizer step is about to use, every ``log_every_n_steps``
    steps of the Trainer; ``"epoch"`` logs it at the start of every epoch. An optimizer is named after the
    ``name`` of its scheduler's config when it has one, else ``lr-<OptimizerClass>`` (``-1``, ``-2``, ... for
    later optimizers of the same class); with several param groups each gets ``/<group's "name">`` or
    ``/pg<i>`` (from 1). Rates go to the Trainer's loggers only (from global rank 0), not to ``callback_metrics``.
    """

    def __init__(self, logging_interval: Literal["step", "epoch"] = "step") -> None:
        if logging_interval not in ("step", "epoch"):
            raise ValueError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}) is not valid; expected 'step' or 'epoch'."
            )
        self.logging_interval = logging_interval
        self._last_logged_step: int | None = None

    def setup(self, trainer: Trainer, module: Module, stage: RunStage) -> None:
        if stage == "fit" and not trainer.loggers and not trainer.fast_dev_run:
            raise ValueError(
                "LearningRateMonitor has nothing to log to: the Trainer has no logger. Pass logger=True (CSV), "
                "'tensorboard' or a Logger, or remove the callback."
            )
        self._last_logged_step = None

    def on_train_batch_start(self, trainer: Trainer, module: Module, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        # Within an accumulation window every batch starts the same step: log it once.
        if self.logging_interval != "step" or step == self._last_logged_step:
            return
        if step % trainer.settings.log_every_n_steps == 0:
            self._last_logged_step = step
            trainer.log_to_loggers(self.learning_rates(trainer))

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        if self.logging_interval == "epoch":
            trainer.log_to_loggers(self.learning_rates(trainer))

    def learning_rates(self, trainer: Trainer) -> dict[str, float]:
        """Every param group's current learning rate, by its logged name."""
        named = {
            id(config.scheduler.optimizer): config.name
            for config in trainer.lr_scheduler_configs
            if config.name is not None and hasattr(config.scheduler, "optimizer")
        }
        seen: dict[type, int] = {}
        rates: dict[str, float] = {}
        for optimizer in trainer.optimizers:
            kind = type(optimizer)
            count = seen[kind] = seen.get(kind, 0) + 1
            name = named.get(id(optimizer)) or f"lr-{kind.__name__}" + (f"-{count - 1}" if count > 1 else "")
            groups = optimizer.param_groups
            for index, group in enumerate(groups):
                if len(groups) > 1:
                    key = f"{name}/{group.get('name', f'pg{index + 1}')}"
                else:
                    key = f"{name}/{group['name']}" if group.get("name") else name
                rates[key] = float(group["lr"])
        return rates
