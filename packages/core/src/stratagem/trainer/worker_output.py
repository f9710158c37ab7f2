"""What a worker sends back to a calling process that is not itself a worker (spawn, fork)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_map

from stratagem.strategies.compilation import compile_submodules_in_place
from stratagem.trainer.progress import Throughput

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.run_context import RunContext
    from stratagem.trainer.trainer import Trainer


@dataclass
class WorkerOutput:
    """The outcome of one run on rank 0: small, picklable, CPU-only."""

    results: list[dict[str, float]] = field(default_factory=list)
    predictions: Any = None
    callback_metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    last_evaluation_metrics: dict[str, float] = field(default_factory=dict)
    fit_progress: dict[str, Any] = field(default_factory=dict)
    callback_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    logger_versions: list[Any] = field(default_factory=list)
    throughput: Throughput = field(default_factory=Throughput)
    module_state: dict[str, torch.Tensor] | None = None

    @classmethod
    def collect(
        cls,
        trainer: Trainer,
        context: RunContext,
        results: list[dict[str, float]],
        predictions: Any,
        returns_to_caller: bool,
    ) -> WorkerOutput:
        """Gather the outcome. Call on every rank: sharded strategies gather the weights collectively."""
        if not returns_to_caller:
            # The caller's objects are the worker's: only the return values are needed.
            return cls(results=results, predictions=predictions)
        return cls(
            results=results,
            predictions=tree_map(_to_cpu, predictions),
            callback_metrics=context.metrics.cpu_metrics(),
            last_evaluation_metrics=dict(trainer.last_evaluation_metrics),
            fit_progress=trainer.fit_progress.state_dict(),
            callback_states={callback.state_key: callback.state_dict() for callback in trainer.callbacks},
            logger_versions=[getattr(logger, "version", None) for logger in trainer.loggers],
            throughput=trainer.throughput,
            module_state=trainer.runtime.module_full_state_dict(),
        )

    def apply(self, trainer: Trainer, context: RunContext, module: Module) -> None:
        """Make the caller's trainer and module look as they would had the run happened here."""
        context.metrics.callback_metrics = dict(self.callback_metrics)
        trainer.last_evaluation_metrics = dict(self.last_evaluation_metrics)
        trainer.fit_progress.load_state_dict(self.fit_progress)
        trainer.throughput = self.throughput
        for callback in trainer.callbacks:
            if callback.state_key in self.callback_states:
                callback.load_state_dict(self.callback_states[callback.state_key])
        for logger, version in zip(trainer.loggers, self.logger_versions):
            if version is not None and hasattr(logger, "version"):
                logger.version = version
        if self.module_state:
            module.configure_model()
            # As in the workers, whose state this is: submodules compiled there keep their uncompiled names.
            compile_submodules_in_place(module)
            module.load_state_dict(self.module_state)


def _to_cpu(value: Any) -> Any:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value
