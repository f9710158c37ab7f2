"""What hooks record through ``Module.log``: latest step values and per-epoch aggregates.

Values stay tensors on their device; nothing here calls ``.item()`` per step. Conversion to
floats happens only when a logger or the progress bar reads them, at their own intervals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from stratagem.runtime import Runtime

ReduceFx = Literal["mean", "sum", "max", "min"]
Stage = Literal["train_step", "train_epoch", "evaluation", "predict"]
EpochGroup = Literal["train", "evaluation"]

_REDUCE_FX: dict[Any, ReduceFx] = {
    "mean": "mean",
    "sum": "sum",
    "max": "max",
    "min": "min",
    torch.mean: "mean",
    torch.sum: "sum",
    torch.max: "max",
    torch.min: "min",
}


class _EpochAggregate:
    __slots__ = ("key", "logger", "prog_bar", "reduce_fx", "sync_dist", "total", "weight")

    def __init__(
        self, key: str, value: torch.Tensor, weight: int, reduce_fx: ReduceFx, options: tuple[bool, bool, bool]
    ) -> None:
        self.key = key
        self.prog_bar, self.logger, self.sync_dist = options
        self.reduce_fx = reduce_fx
        self.total = value * weight if reduce_fx == "mean" else value
        self.weight = weight

    def add(self, value: torch.Tensor, weight: int) -> None:
        if self.reduce_fx == "mean":
            self.total = self.total + value * weight
            self.weight += weight
        elif self.reduce_fx == "sum":
            self.total = self.total + value
        elif self.reduce_fx == "max":
            self.total = torch.maximum(self.total, value)
        else:
            self.total = torch.minimum(self.total, value)

    def compute(self, runtime: Runtime) -> torch.Tensor:
        total = self.total
        if self.reduce_fx == "mean":
            weight = torch.tensor(float(self.weight), device=total.device)
            if self.sync_dist:
                group = runtime.data_parallel_group
                total = runtime.all_reduce(total, "sum", group)
                weight = runtime.all_reduce(weight, "sum", group)
            return total / weight
        if self.sync_dist:
            return runtime.all_reduce(total, self.reduce_fx, runtime.data_parallel_group)
        return total


class LoggedMetrics:
    """The metrics of one Trainer: filled by ``Module.log``, read by callbacks, loggers and the bar.

    The loops set :attr:`stage` (which decides the ``on_step``/``on_epoch`` defaults),
    :attr:`suffix` (``/dataloader_idx_N`` with several evaluation dataloaders) and
    :attr:`batch` (for inferring batch sizes).
    """

    def __init__(self) -> None:
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.step_logger_keys: dict[str, None] = {}
        self.prog_bar_keys: dict[str, None] = {}
        self.stage: Stage | None = None
        self.suffix = ""
        self.batch: Any = None
        self.runtime: Runtime | None = None
        """The run's Runtime, through which ``sync_dist`` values are reduced (set by the Trainer in each worker)."""
        # Training and evaluation aggregate separately: a validation pass in the middle of a
        # training epoch must not consume the training epoch's values.
        self._epoch: dict[EpochGroup, dict[str, _EpochAggregate]] = {"train": {}, "evaluation": {}}
        self._epoch_end_values: dict[str, torch.Tensor] = {}
        # (name, options) of values a training step logged before as plain step values -> their key.
        self._step_value_keys: dict[tuple[Any, ...], str] = {}

    def log(
        self,
        name: str,
        value: torch.Tensor | float | int,
        *,
        prog_bar: bool,
        logger: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        sync_dist: bool,
        reduce_fx: ReduceFx | Callable[..., Any],
        batch_size: int | None,
    ) -> None:
        stage = self.stage
        options = None
        if stage == "train_step":
            # The same name logged again with the same options: everything but the value is known (and
            # checked). Most training steps log this way, on every step, so it is worth keeping short.
            options = (name, prog_bar, logger, on_step, on_epoch, sync_dist, reduce_fx)
            known_key = self._step_value_keys.get(options)
            if known_key is not None and type(value) is torch.Tensor and value.numel() == 1:
                self.callback_metrics[known_key] = value.detach()
                return
        if stage is None or stage == "predict":
            raise RuntimeError(f"self.log({name!r}) is not supported here; log from training/validation/test hooks.")
        fx = _REDUCE_FX.get(reduce_fx)
        if fx is None:
            raise ValueError(
                f"self.log({name!r}, reduce_fx={reduce_fx!r}) is not valid; use 'mean', 'sum', 'max' or 'min'."
            )
        if on_step is None:
            on_step = stage == "train_step"
        if on_epoch is None:
            on_epoch = stage != "train_step"
        tensor = _as_tensor(value, name)
        if self.suffix:
            name = name + self.suffix
        if stage == "train_epoch":
            # At the end of an epoch there is nothing left to aggregate over: the value counts now.
            epoch_value = self._reduce(tensor, fx) if sync_dist else tensor
            self.callback_metrics[name] = epoch_value
            if prog_bar:
                self.prog_bar_keys[name] = None
            if logger:
                self._epoch_end_values[name] = epoch_value
            return
        if on_step:
            step_value = self._reduce(tensor, fx) if sync_dist else tensor
            key = f"{name}_step" if on_epoch else name
            self.callback_metrics[key] = step_value
            if logger:
                self.step_logger_keys[key] = None
            if prog_bar:
                self.prog_bar_keys[key] = None
            if options is not None and not on_epoch and not sync_dist and not self.suffix:
                self._step_value_keys[options] = key
        if on_epoch:
            weight = batch_size if batch_size is not None else _batch_size(self.batch)
            if tensor.dtype not in (torch.float32, torch.float64):
                tensor = tensor.float()
            aggregates = self._epoch["evaluation" if stage == "evaluation" else "train"]
            aggregate = aggregates.get(name)
            if aggregate is None:
                key = f"{name}_epoch" if on_step else name
                aggregates[name] = _EpochAggregate(key, tensor, weight, fx, (prog_bar, logger, sync_dist))
            else:
                aggregate.add(tensor, weight)

    def finish_epoch(self, group: EpochGroup) -> dict[str, float]:
        """Turn this epoch's aggregates into ``callback_metrics``; return those meant for loggers."""
        for_logger: dict[str, float] = {}
        for aggregate in self._epoch[group].values():
            value = aggregate.compute(self._runtime)
            key = aggregate.key
            self.callback_metrics[key] = value
            if aggregate.prog_bar:
                self.prog_bar_keys[key] = None
            if aggregate.logger:
                for_logger[key] = float(value)
        self._epoch[group] = {}
        return for_logger

    def take_epoch_end_values(self) -> dict[str, float]:
        """Values logged in training-epoch-end hooks since the last call, meant for loggers."""
        values, self._epoch_end_values = self._epoch_end_values, {}
        return {key: float(value) for key, value in values.items()}

    def step_metrics_for_logger(self) -> dict[str, float]:
        """The latest step values meant for loggers, as floats (one device sync per call)."""
        metrics = self.callback_metrics
        return {key: float(metrics[key]) for key in self.step_logger_keys if key in metrics}

    def progress_bar_metrics(self) -> dict[str, float]:
        metrics = self.callback_metrics
        return {key: float(metrics[key]) for key in self.prog_bar_keys if key in metrics}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return dict(self.callback_metrics)

    def restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        """Go back to a :meth:`snapshot`, forgetting evaluation values logged since (the sanity check)."""
        self.callback_metrics = snapshot
        self._epoch["evaluation"] = {}

    def cpu_metrics(self) -> dict[str, torch.Tensor]:
        """``callback_metrics`` moved to CPU, for sending to another process."""
        return {key: value.detach().cpu() for key, value in self.callback_metrics.items()}

    @property
    def _runtime(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("metrics are not connected to a run's Runtime")
        return self.runtime

    def _reduce(self, tensor: torch.Tensor, fx: ReduceFx) -> torch.Tensor:
        # Over the ranks that saw different data: tensor-parallel ranks log the same value, which a sum must count once.
        runtime = self._runtime
        return runtime.all_reduce(tensor, fx, runtime.data_parallel_group)  # type: ignore[no-any-return]


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}) needs a scalar; got a tensor of shape {tuple(value.shape)}.")
        return value.detach()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"self.log({name!r}) needs a number or a scalar tensor; got {type(value).__name__}.")
    return torch.tensor(float(value))


def _batch_size(batch: Any) -> int:
    """The size of the first tensor found in a (nested) batch; 1 when there is none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, list | tuple):
        for item in batch:
            size = _batch_size(item)
            if size != 1 or isinstance(item, torch.Tensor):
                return size
    if isinstance(batch, dict):
        for item in batch.values():
            return _batch_size(item)
    return 1
