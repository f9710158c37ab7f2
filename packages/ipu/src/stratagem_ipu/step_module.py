"""The module PopTorch compiles: one of the user's step methods on one micro-batch.

A compiled executable gives values back only as its outputs, and its Python runs once, when it is
traced. So what the step logs with ``self.log`` is recorded while it runs, returned as outputs beside
what the step returned (one value per micro-batch), and logged again on the host after the call,
reduced over the micro-batches (:func:`log_reduced`). Which names were logged, with which options, is
taken from the first run (the trace), as the executable would know it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from stratagem import Module

_LOG_SIGNATURE = inspect.signature(Module.log)


@dataclass(frozen=True)
class LoggedName:
    """One ``self.log`` call of the step: its name and options (``value`` travels as an output)."""

    name: str
    options: dict[str, Any]


class StepModule(nn.Module):
    """Runs ``module.<step_name>(batch, batch_idx, *extra)`` and returns ``(result, logged values)``.

    ``mark_loss`` (training) receives the loss and returns the tensor the engine runs backward on
    (``poptorch.identity_loss``); the result is then that loss. Without it the result is what the step
    returned.
    """

    def __init__(
        self,
        module: Module,
        step_name: str,
        forward_context: Callable[[], contextlib.AbstractContextManager[Any]],
        mark_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
        extra_args: tuple[Any, ...] = (),
    ) -> None:
        super().__init__()
        self.module = module
        self.step_name = step_name
        self._forward_context = forward_context
        self._mark_loss = mark_loss
        self._extra_args = extra_args
        self.logged: list[LoggedName] | None = None

    def forward(self, batch: Any, batch_idx: torch.Tensor) -> tuple[Any, tuple[torch.Tensor, ...]]:
        records: list[tuple[str, Any, dict[str, Any]]] = []
        with _capturing_logs(self.module, records), self._forward_context():
            output = getattr(self.module, self.step_name)(batch, batch_idx.reshape(()), *self._extra_args)
        if self.logged is None:
            self.logged = [LoggedName(name, options) for name, _, options in records]
        values = tuple(torch.as_tensor(value).detach().float() for _, value, _ in records)
        if self._mark_loss is None:
            return output, values
        return self._mark_loss(_loss_of(output)), values


def log_reduced(module: Module, logged: list[LoggedName], values: tuple[torch.Tensor, ...], micro_batches: int) -> None:
    """Log on the host what the step logged on each micro-batch of one call, reduced with its ``reduce_fx``."""
    for entry, per_micro_batch in zip(logged, values, strict=True):
        options = dict(entry.options)
        reduced = _reduce(per_micro_batch, options.pop("reduce_fx"))
        if options.get("batch_size") is not None:
            options["batch_size"] *= micro_batches
        module.log(entry.name, reduced, reduce_fx=_epoch_reduction(entry.options["reduce_fx"]), **options)


def _reduce(values: torch.Tensor, reduce_fx: Any) -> torch.Tensor:
    reduction = _epoch_reduction(reduce_fx)
    if reduction == "mean":
        return values.mean(dim=0)
    if reduction == "sum":
        return values.sum(dim=0)
    if reduction == "max":
        return values.max(dim=0).values
    if reduction == "min":
        return values.min(dim=0).values
    return torch.as_tensor(reduce_fx(values))


def _epoch_reduction(reduce_fx: Any) -> Any:
    names = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}
    return names.get(reduce_fx, reduce_fx)


def _loss_of(output: Any) -> torch.Tensor:
    loss = output["loss"] if isinstance(output, Mapping) and "loss" in output else output
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"training_step returned {type(output).__name__}; on IPUs it must return the loss (a tensor) or a dict "
            "with a 'loss' tensor: the compiled step always runs backward, so a batch cannot be skipped by "
            "returning None."
        )
    return loss


@contextlib.contextmanager
def _capturing_logs(module: Module, records: list[tuple[str, Any, dict[str, Any]]]) -> Iterator[None]:
    """Route ``module.log`` (and ``log_dict``, which calls it) into ``records`` while the step runs."""

    def record(*args: Any, **kwargs: Any) -> None:
        bound = _LOG_SIGNATURE.bind(module, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        name, value = arguments.pop("name"), arguments.pop("value")
        records.append((name, value, arguments))

    # An instance attribute shadows the method for the duration of the step only.
    object.__setattr__(module, "log", record)
    try:
        yield
    finally:
        object.__delattr__(module, "log")
