"""Reading what ``Module.configure_optimizers`` returned, and stepping learning-rate schedulers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

_FORMS = (
    "an optimizer, a list of optimizers, ([optimizers], [schedulers]), a dict with 'optimizer' and optionally "
    "'lr_scheduler', or a list of such dicts"
)
_OPTIMIZER_KEYS = {"optimizer", "lr_scheduler"}
_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name"}


@dataclass
class SchedulerConfig:
    """One scheduler and when it steps: every ``frequency`` optimizer steps or epochs."""

    scheduler: Any
    interval: Literal["step", "epoch"] = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None


@dataclass
class OptimizerSetup:
    optimizers: list[Optimizer]
    schedulers: list[SchedulerConfig] = field(default_factory=list)


def configured_optimizers(module: Any, strategy_supplies_optimizer: bool) -> OptimizerSetup:
    """What ``module.configure_optimizers()`` returned, parsed.

    When the strategy creates the optimizer itself (``Strategy.supplies_optimizer``, e.g. from a
    DeepSpeed config's ``optimizer`` section), the module may leave ``configure_optimizers`` out or
    return nothing (``None``, ``[]``, ``([], [])``), as in Lightning.
    """
    from stratagem.module import Module

    if strategy_supplies_optimizer and type(module).configure_optimizers is Module.configure_optimizers:
        return OptimizerSetup([])
    returned = module.configure_optimizers()
    if strategy_supplies_optimizer and _is_nothing(returned):
        return OptimizerSetup([])
    return parse_optimizers(returned)


def _is_nothing(returned: Any) -> bool:
    if returned is None:
        return True
    if not isinstance(returned, list | tuple):
        return False
    return all(isinstance(part, list | tuple) and not part for part in returned)


def parse_optimizers(returned: Any) -> OptimizerSetup:
    """Turn any accepted ``configure_optimizers`` return value into optimizers and scheduler configs."""
    if isinstance(returned, Optimizer):
        return OptimizerSetup([returned])
    if isinstance(returned, Mapping):
        return _parse_dicts([returned])
    if isinstance(returned, list | tuple) and returned:
        if len(returned) == 2 and all(isinstance(part, list | tuple) for part in returned):
            optimizers, schedulers = returned
            setup = OptimizerSetup(_check_optimizers(optimizers))
            setup.schedulers = [_scheduler_config(item) for item in schedulers]
            return setup
        if all(isinstance(item, Optimizer) for item in returned):
            return OptimizerSetup(list(returned))
        if all(isinstance(item, Mapping) for item in returned):
            return _parse_dicts(list(returned))
    raise TypeError(f"configure_optimizers() returned {_describe(returned)}; expected {_FORMS}.")


def _parse_dicts(items: list[Mapping[str, Any]]) -> OptimizerSetup:
    setup = OptimizerSetup([])
    for item in items:
        unknown = set(item) - _OPTIMIZER_KEYS
        if unknown or "optimizer" not in item:
            raise ValueError(
                f"configure_optimizers() returned a dict with keys {sorted(item)}; it needs 'optimizer' and "
                f"accepts only {sorted(_OPTIMIZER_KEYS)}."
            )
        setup.optimizers.extend(_check_optimizers([item["optimizer"]]))
        if item.get("lr_scheduler") is not None:
            setup.schedulers.append(_scheduler_config(item["lr_scheduler"]))
    return setup


def _check_optimizers(items: Any) -> list[Optimizer]:
    optimizers = list(items)
    for optimizer in optimizers:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"configure_optimizers() returned {_describe(optimizer)} where an optimizer was expected "
                "(a torch.optim.Optimizer)."
            )
    if not optimizers:
        raise ValueError(f"configure_optimizers() returned no optimizer; expected {_FORMS}.")
    return optimizers


def _scheduler_config(item: Any) -> SchedulerConfig:
    if not isinstance(item, Mapping):
        item = {"scheduler": item}
    unknown = set(item) - _SCHEDULER_KEYS
    if unknown or "scheduler" not in item:
        raise ValueError(
            f"The lr_scheduler dict has keys {sorted(item)}; it needs 'scheduler' and accepts only "
            f"{sorted(_SCHEDULER_KEYS)}."
        )
    config = SchedulerConfig(**item)
    if not hasattr(config.scheduler, "step") or not hasattr(config.scheduler, "state_dict"):
        raise TypeError(
            f"lr_scheduler={_describe(config.scheduler)} is not a learning-rate scheduler (it needs step() and "
            "state_dict(), like those in torch.optim.lr_scheduler)."
        )
    if config.interval not in ("step", "epoch"):
        raise ValueError(f"lr_scheduler interval={config.interval!r} is not valid; use 'step' or 'epoch'.")
    if isinstance(config.frequency, bool) or not isinstance(config.frequency, int) or config.frequency < 1:
        raise ValueError(f"lr_scheduler frequency={config.frequency!r} is not valid; use a positive int.")
    if isinstance(config.scheduler, ReduceLROnPlateau) and config.monitor is None:
        raise ValueError(
            "ReduceLROnPlateau needs a metric: return {'scheduler': ..., 'monitor': '<logged metric name>'} "
            "as the lr_scheduler."
        )
    return config


def step_schedulers(
    configs: list[SchedulerConfig], interval: str, count: int, metrics: Mapping[str, torch.Tensor]
) -> None:
    """Step the schedulers of ``interval`` that are due after ``count`` optimizer steps or epochs."""
    for config in configs:
        if config.interval != interval or count % config.frequency != 0:
            continue
        if config.monitor is None:
            config.scheduler.step()
            continue
        value = metrics.get(config.monitor)
        if value is None:
            if config.strict:
                available = ", ".join(sorted(metrics)) or "none"
                raise RuntimeError(
                    f"The lr_scheduler monitors {config.monitor!r}, which was not logged by this point "
                    f"(logged: {available}). Log it with self.log, or set 'strict': False to skip the step."
                )
            continue
        config.scheduler.step(float(value))


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})" if not isinstance(value, list | tuple | dict) else type(value).__name__
