"""The prediction pass: ``predict_step`` on every batch, outputs collected in order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from stratagem.trainer.data import count_batches, limited

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.run_context import RunContext
    from stratagem.trainer.trainer import Trainer


def run_prediction(
    trainer: Trainer, context: RunContext, module: Module, loaders: list[Iterable[Any]], limit: int | float
) -> Any:
    """This rank's predictions: a list with one entry per batch, or a list of such lists with several
    dataloaders. With a strategy that splits data, each rank predicts its own share."""
    runtime = trainer.runtime
    at_step_boundary = runtime.step_boundary
    calls = runtime.step_calls("predict_step")
    to_device, run_step = calls.batch_to_device, calls.run_step
    hooks = context.hooks
    module.eval()
    context.metrics.stage = "predict"
    hooks.call("on_predict_start", trainer, module)
    module.on_predict_epoch_start()
    batch_end_hooks = hooks.overriding("on_predict_batch_end")
    several = len(loaders) > 1
    feed = runtime.batch_feed
    predictions: list[list[Any]] = []
    with torch.no_grad():
        for dataloader_idx, loader in enumerate(loaders):
            outputs: list[Any] = []
            count = count_batches(loader, limit, "limit_predict_batches")
            for batch_idx, batch in enumerate(feed(limited(loader, count))):
                batch = to_device(batch)
                arguments = (batch, batch_idx, dataloader_idx) if several else (batch, batch_idx)
                if at_step_boundary is not None:
                    at_step_boundary("before_evaluation_step")
                output = run_step(*arguments)
                outputs.append(output)
                for hook in batch_end_hooks:
                    hook(trainer, module, output, batch, batch_idx, dataloader_idx)
            predictions.append(outputs)
    module.on_predict_epoch_end()
    hooks.call("on_predict_end", trainer, module)
    return predictions if several else predictions[0]
